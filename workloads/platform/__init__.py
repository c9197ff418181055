"""Cluster controllers as Helm releases, namespaces with their Pod Security labels, generated
secrets, optional features and the dict-to-Pulumi adapter.
"""
