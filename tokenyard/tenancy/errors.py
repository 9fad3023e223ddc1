"""What a management operation refuses: callers turn these into their own errors (404, 409)."""


class ManagementError(Exception):
    """A management operation named a team or key that does not exist or already exists."""


class AlreadyExists(ManagementError):
    """The team to create exists already."""


class OperatorsChoice(ManagementError):
    """A team tried to change what the operator set for it."""
