"""Authentication and authorization data: users, ACL rules, the access decision and their files."""

from tidemark.broker.auth.acl import (
    AclRule,
    Action,
    Decision,
    Resource,
    ResourceType,
    User,
    evaluate,
)
from tidemark.broker.auth.store import AuthStore

__all__ = ["AclRule", "Action", "AuthStore", "Decision", "Resource", "ResourceType", "User", "evaluate"]
