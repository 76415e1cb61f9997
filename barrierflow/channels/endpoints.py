"""The two structural types that dispatchers and merges accept as their outputs and inputs.

Anything with these methods plugs in: our own channel ends, anyio memory object streams, or a
test double that records what it saw.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Sender", "Receiver"]

T_contra = TypeVar("T_contra", contravariant=True)
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class Sender(Protocol[T_contra]):
    """Something messages can be sent to, with backpressure, and then closed."""

    async def send(self, item: T_contra, /) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Receiver(Protocol[T_co]):
    """Something messages can be received from; ``receive`` raises
    :class:`anyio.EndOfStream` at the end."""

    async def receive(self) -> T_co: ...
