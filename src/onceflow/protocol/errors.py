"""Errors of the wire-protocol layer.

A remote protocol error is the client's fault (the connection is answered with a Kafka error
or closed); it never takes the broker down.
"""


class ProtocolError(Exception):
    """The peer broke the framing or request rules; the connection should be closed."""


class FrameTooLargeError(ProtocolError):
    """A frame announced more than socket.request.max.bytes; refused before it is read."""


class UnknownApiKeyError(ProtocolError):
    """A request for an API this broker does not know."""


class UnsupportedVersionError(ProtocolError):
    """A request for a version outside the advertised range of a known API."""


class MalformedRequestError(ProtocolError):
    """A request whose header or body does not parse as its schema says."""
