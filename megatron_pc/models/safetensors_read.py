"""Reading a (sharded) Hugging Face safetensors checkpoint lazily, one tensor at a time, with
errors that name the file at fault. The converters' writer is ``conversion/safetensors_io.py``."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from megatron_pc.errors import ConversionError

INDEX = "model.safetensors.index.json"
"""The index of a sharded checkpoint: tensor name -> file."""


class HFReader:
    """Lazy access to the tensors of an HF directory (``safe_open``: nothing is read until asked)."""

    def __init__(self, model_dir: Path) -> None:
        self.root = Path(model_dir)
        self._stack = ExitStack()
        self._where: dict[str, tuple[Path, Any]] = {}
        for path, names in self._files().items():
            handle = self._open(path)
            for name in names if names is not None else handle.keys():
                self._where[name] = (path, handle)

    def _files(self) -> dict[Path, list[str] | None]:
        """File -> the tensors the index puts there (None: whatever the file holds)."""
        index = self.root / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as err:
                raise ConversionError(f"{index}: not a safetensors index ({err})") from None
            files: dict[Path, list[str] | None] = {}
            for name, file in weight_map.items():
                files.setdefault(self.root / file, []).append(name)  # type: ignore[union-attr]
            return files
        found = sorted(self.root.glob("*.safetensors"))
        if not found:
            raise ConversionError(f"{self.root}: no *.safetensors files and no {INDEX}")
        return {path: None for path in found}

    def _open(self, path: Path) -> Any:
        from safetensors import safe_open

        if not path.is_file():
            raise ConversionError(f"{path}: missing (listed in {self.root / INDEX})")
        try:
            return self._stack.enter_context(safe_open(str(path), framework="pt"))
        except Exception as err:  # safetensors raises its own error types for bad headers
            raise ConversionError(f"{path}: unreadable safetensors file (truncated or corrupt?): {err}") from None

    def names(self) -> list[str]:
        """Every tensor in the files (as the index places them, if there is one)."""
        return list(self._where)

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """Tensor ``name`` is there with ``shape`` (its header is read, not its data)."""
        if name not in self._where:
            raise ConversionError(f"{self.root}: tensor {name!r} is missing from the checkpoint's safetensors files")
        path, handle = self._where[name]
        try:
            found = tuple(handle.get_slice(name).get_shape())
        except Exception as err:
            raise ConversionError(f"{path}: cannot read the header of tensor {name!r}: {err}") from None
        if found != tuple(shape):
            raise ConversionError(f"{path}: tensor {name!r} has shape {found}, the config implies {tuple(shape)}")

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Tensor ``name``, checked to have ``shape``."""
        self.check(name, shape)
        path, handle = self._where[name]
        try:
            return handle.get_tensor(name)
        except Exception as err:
            raise ConversionError(f"{path}: cannot read tensor {name!r}: {err}") from None

    def close(self) -> None:
        """Close every file."""
        self._stack.close()

    def __enter__(self) -> "HFReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
