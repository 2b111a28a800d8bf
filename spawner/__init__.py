"""Spawners: the local GPU spawner (embedded default) and the Kubernetes one."""
