"""trainhub"""
