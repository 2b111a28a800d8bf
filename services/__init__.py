"""trainhub's hub services: the jobs API (``jobs``), the scheduler policy, the idle-GPU culler."""
