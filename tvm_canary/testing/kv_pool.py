"""``KvPool``: the K and V bytes of one slot space, as real-KV sources the canary folds."""

from __future__ import annotations

import torch

from ..context import RealKvSource

HALVES = ("K", "V")


class KvPool:
    """Per half ("K", "V") a tuple of real-KV sources (one per layer) over one slot space.

    ``write`` is the model's forward (fresh random bytes in every source's strip of each slot) and ``flip`` corrupts one
    byte. Sources may be any layout a ``RealKvSource`` describes (paged, strided row views, any dtype): both act on the
    uint8 view of the source tensor.
    """

    def __init__(self, sources: dict[str, tuple[RealKvSource, ...]], gen: torch.Generator) -> None:
        self._sources = {half: tuple(srcs) for half, srcs in sources.items()}
        self.gen = gen

    @classmethod
    def paged(
        cls,
        num_slots: int,
        *,
        gen: torch.Generator,
        device: torch.device | str,
        page_size: int = 4,
        layers: int = 2,
        bytes_per_token: int = 64,
    ) -> KvPool:
        """Zeroed uint8 ``[pages, page_size * bytes_per_token]`` per layer and half; every byte is folded."""
        pages = -(-num_slots // page_size)

        def source() -> RealKvSource:
            tensor = torch.zeros(pages, page_size * bytes_per_token, dtype=torch.uint8, device=device)
            return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=bytes_per_token,
                                read_bytes=bytes_per_token)

        return cls({half: tuple(source() for _ in range(layers)) for half in HALVES}, gen)

    def sources(self, half: str) -> tuple[RealKvSource, ...]:
        """The real-KV sources of ``half`` (empty for a half the pool does not have)."""
        return self._sources.get(half, ())

    @staticmethod
    def _strip(src: RealKvSource, slot: int) -> torch.Tensor:
        """The ``num_bytes_per_token`` bytes of ``slot`` in ``src`` (a view)."""
        col = (slot % src.page_size) * src.num_bytes_per_token
        return src.tensor.view(torch.uint8)[slot // src.page_size, col : col + src.num_bytes_per_token]

    def write(self, slots: list[int]) -> None:
        """The model's forward: fresh random bytes for ``slots`` in every source."""
        if not slots:
            return
        # A slot named twice (padding tokens all write the reserved slot 0) keeps its last token's bytes:
        # an indexed store with repeated indices picks an arbitrary winner on CUDA, so only the last
        # occurrence is stored, as the CPU's in-order store leaves it.
        last = torch.tensor(sorted({slot: i for i, slot in enumerate(slots)}.values()), dtype=torch.int64)
        index = torch.tensor(slots, dtype=torch.int64)[last]
        for srcs in self._sources.values():
            for src in srcs:
                nbpt = src.num_bytes_per_token
                rows = (index // src.page_size).unsqueeze(1)
                cols = (index % src.page_size).unsqueeze(1) * nbpt + torch.arange(nbpt)
                data = torch.randint(0, 256, (len(slots), nbpt), dtype=torch.uint8, generator=self.gen)[last]
                dev = src.tensor.device
                src.tensor.view(torch.uint8)[rows.to(dev), cols.to(dev)] = data.to(dev)

    def flip(self, half: str, layer: int, slot: int, byte: int, mask: int) -> None:
        """XOR byte ``byte`` of ``slot``'s strip in source ``layer`` of ``half`` with ``mask``."""
        self._strip(self._sources[half][layer], slot)[byte] ^= mask
