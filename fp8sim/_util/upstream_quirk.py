"""The warning fp8sim gives where it reproduces an upstream behaviour that surprises users."""

__all__ = ["UpstreamQuirkWarning"]


class UpstreamQuirkWarning(UserWarning):
    """fp8sim reproduced an upstream behaviour that differs from its documentation or from what the
    code asks for (e.g. an argument that upstream accepts and ignores)."""
