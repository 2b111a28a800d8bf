"""Kubernetes code shared by the parts that run on a cluster (core, optional-dependency).

The notebook spawner (``trainhub.spawner``) and the job launcher (``trainhub.services.jobs``) are
independent parts; what both need about Kubernetes lives here, below both:

- :mod:`trainhub.kube.names`: the labels and annotations that say whose a pod is, the environment
  keys that carry credentials, DNS-1123 names.
- :mod:`trainhub.kube.pods`: what both pod kinds need (a memory-backed ``/dev/shm``).
- :mod:`trainhub.kube.reflector`: the one watch cache (kubespawner's reflector) for every kind watched.

Modules here import the Kubernetes client libraries (the ``kubernetes`` extra) only inside
functions, so importing them never needs a cluster or the extra.
"""
