"""Dense retrieval: an E5-style encoder and a FAISS index (Search-R1's e5-base-v2 + Flat).

A text's embedding is the mean of the encoder's last hidden states over its tokens,
L2-normalised, so the inner product is the cosine similarity:

    e(x) = m / ||m||,  m = sum_t h_t(x) * mask_t / sum_t mask_t,   score(q, d) = e(q) . e(d)

Queries get the prefix "query: " and passages "passage: " (E5's recipe; configurable), and a
passage is encoded as its Search-R1 `contents` (title line + text). Index types: "flat"
(exact, IndexFlatIP, 4*dim bytes a passage), "pq" (IndexPQ, m bytes a passage with 8-bit
codes) and "ivfpq" (IndexIVFPQ: m bytes + an 8-byte id a passage, searches only `nprobe`
of its `nlist` lists). faiss is the optional extra `dense` (faiss-cpu); `make install` on a GPU
machine puts a GPU build in its place (faiss-cuda, docs/retrieval.md).

Where the index searches: `place_index` copies a flat index to every GPU faiss sees (fp16,
sharded, as Search-R1's `--faiss_gpu`) and says where it went, or why it stayed on the CPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from common.retrieval.base import Doc, doc_contents, read_corpus
from common.retrieval.doc_store import DocStore, read_config, write_config

INDEX_FILE = "index.faiss"
INDEX_TYPES = ("flat", "pq", "ivfpq")


FAISS_GPU_MODES = ("auto", "on", "off")
# the GPU build scripts/install.sh puts in faiss-cpu's place (CUDA 13, as torch 2.13.0's wheels)
GPU_FAISS = "faiss-cuda==1.14.1.post4"
GPU_FAISS_INSTALL = f"pip uninstall -y faiss-cpu && pip install {GPU_FAISS}"


def import_faiss() -> Any:
    """The faiss module, or an ImportError that says how to install it."""
    try:
        import faiss
    except ImportError:
        raise ImportError(
            "dense retrieval needs faiss: `pip install -e .[dense]` (faiss-cpu), or on a GPU "
            f"machine `pip install {GPU_FAISS}`"
        ) from None
    return faiss


class IndexPlacementError(ValueError):
    """``faiss_gpu="on"`` and the index cannot go to a GPU; the message says why."""


def faiss_gpu_problem() -> str:
    """Why faiss cannot put an index on a GPU here ("" when it can): a CPU build (and, when
    torch sees GPUs, the command that brings the GPU build), or no GPU visible."""
    faiss = import_faiss()
    if not hasattr(faiss, "StandardGpuResources"):
        why = f"faiss {faiss.__version__} is a CPU build"
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus:
            why += f", though torch sees {gpus} GPU(s): `{GPU_FAISS_INSTALL}`"
        return why
    if faiss.get_num_gpus() == 0:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        return f"faiss sees no GPU (CUDA_VISIBLE_DEVICES {'unset' if devices is None else repr(devices)})"
    return ""


def place_index(index: Any, faiss_gpu: str = "auto", *, fp16: bool = True) -> tuple[Any, str]:
    """``(index, where)``: a flat index copied to every GPU faiss sees (``fp16``: stored in
    float16, half the memory: 21M x 768 is 32 GB; several GPUs: sharded, each holds a slice),
    or the index unchanged; ``where`` says which, and why the CPU when it is the CPU.

    ``faiss_gpu``: ``auto`` (the GPUs when there are some), ``on`` (the GPUs, else an
    ``IndexPlacementError`` saying why not), ``off`` (the CPU). The GPUs are those
    ``CUDA_VISIBLE_DEVICES`` leaves visible. Only flat indexes go (the paper's E5 index is
    one): PQ has no GPU form, and an IVF index's ``nprobe`` would need setting on each shard.
    """
    if faiss_gpu not in FAISS_GPU_MODES:
        raise ValueError(f"faiss_gpu must be one of {FAISS_GPU_MODES}, got {faiss_gpu!r}")
    if faiss_gpu == "off":
        return index, "the CPU (--faiss-gpu off)"
    faiss = import_faiss()
    why = faiss_gpu_problem()
    if not why and not isinstance(index, faiss.IndexFlat):
        why = f"a {type(index).__name__} stays on the CPU (only flat indexes go to GPUs)"
    if why:
        if faiss_gpu == "on":
            raise IndexPlacementError(f"--faiss-gpu on, but the index cannot go to a GPU: {why}")
        return index, f"the CPU ({why})"
    n = faiss.get_num_gpus()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = "unset" if devices is None else repr(devices)
    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = fp16
    options.shard = True
    moved = faiss.index_cpu_to_all_gpus(index, co=options)
    how = ("fp16" if fp16 else "fp32") + (", sharded" if n > 1 else "")
    return moved, f"{n} GPU{'s' if n > 1 else ''} ({how}; CUDA_VISIBLE_DEVICES {visible})"


class EncoderMissingError(FileNotFoundError):
    """The encoder could not be loaded: one line saying what to get and how."""

    def __init__(self, path: str, error: Exception):
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if Path(path).is_dir():
            how = "give a folder holding an encoder's config, weights and tokenizer"
        elif path.startswith(("/", ".", "~")) or path.count("/") > 1:
            how = "no such folder: give the encoder's folder or its hub id"
        else:
            how = (
                f"fetch it where the hub is reachable: `hf download {path}` (into the Hugging "
                "Face cache this machine reads; `make data-index` does it for e5-base-v2), or "
                "give a local folder (--dense-encoder DIR)"
            )
        super().__init__(f"the encoder {path} could not be loaded ({reason}); {how}")


class Encoder:
    """Mean-pooled, L2-normalised embeddings from a Hugging Face encoder folder."""

    def __init__(
        self,
        path: str | Path,
        *,
        query_prefix: str = "query: ",
        passage_prefix: str = "passage: ",
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
    ):
        from transformers import AutoModel, AutoTokenizer

        self.path = str(path)
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # fp16 on GPU as Search-R1 serves e5; fp32 on CPU, where fp16 matmuls are slow.
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            self.model = AutoModel.from_pretrained(self.path, dtype=dtype).to(self.device).eval()
        except (OSError, ValueError) as e:  # not cached and no hub to ask, or no model folder
            raise EncoderMissingError(self.path, e) from None
        self.dim: int = self.model.config.hidden_size

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], prefix: str, desc: str | None = None) -> np.ndarray:
        """Embeddings [len(texts), dim] float32 of `prefix + text`; a progress bar if `desc`."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        for start in tqdm(starts, desc=desc, disable=desc is None, unit="batch"):
            batch = [prefix + t for t in texts[start : start + self.batch_size]]
            inputs = self.tokenizer(
                batch,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**inputs).last_hidden_state.float()  # [b, t, dim]
            mask = inputs["attention_mask"].unsqueeze(-1).float()  # [b, t, 1]
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [b, dim]
            out[start : start + len(batch)] = torch.nn.functional.normalize(mean, dim=-1).cpu()
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode(queries, self.query_prefix)

    def encode_passages(self, docs: Sequence[Doc], desc: str | None = None) -> np.ndarray:
        return self.encode([doc_contents(d) for d in docs], self.passage_prefix, desc)


def make_index(
    dim: int,
    index_type: str,
    train: np.ndarray,
    *,
    pq_m: int | None = None,
    nlist: int | None = None,
) -> Any:
    """An empty FAISS inner-product index, trained on `train` [n, dim] when it compresses.

    Defaults: pq_m = the largest divisor of dim up to 64 (768 -> 64 bytes a vector); 8-bit
    codes, fewer when the sample is too small for 256 centroids; nlist = 4 * sqrt(n) capped
    so each list has >= 39 training points (faiss's rule of thumb).
    """
    faiss = import_faiss()
    if index_type not in INDEX_TYPES:
        raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    n = len(train)
    m = pq_m or max(d for d in range(1, min(dim, 64) + 1) if dim % d == 0)
    if dim % m:
        raise ValueError(f"pq_m={m} must divide the embedding dimension {dim}")
    nbits = max(1, min(8, int(math.log2(max(n, 2)))))
    ip = faiss.METRIC_INNER_PRODUCT
    if index_type == "pq":
        index = faiss.IndexPQ(dim, m, nbits, ip)
    else:
        nlist = nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, m, nbits, ip)
    index.train(np.ascontiguousarray(train, dtype=np.float32))
    return index


class DenseRetriever:
    """Encoder + FAISS index + passage store; implements the `Retriever` protocol."""

    def __init__(
        self,
        encoder: Encoder,
        index: Any,
        docs: DocStore,
        nprobe: int = 64,
        index_where: str = "the CPU",
    ):
        if index.ntotal != len(docs):
            raise ValueError(f"index has {index.ntotal} vectors, store {len(docs)} docs")
        self.encoder = encoder
        self.index = index
        self.docs = docs
        self.nprobe = nprobe
        self.index_where = index_where  # where the index searches (`place_index`'s words)
        if hasattr(index, "nprobe"):
            index.nprobe = min(nprobe, index.nlist)

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def build(
        cls,
        docs: Sequence[Doc],
        encoder: Encoder,
        index_type: str = "flat",
        *,
        train_size: int = 100_000,
        chunk_size: int = 65_536,
        seed: int = 0,
        **index_kwargs: Any,
    ) -> DenseRetriever:
        """Encode and index `docs`; compressed indexes train on a random sample first."""
        if not docs:
            raise ValueError("cannot build a dense index over an empty corpus")
        sample: np.ndarray = np.empty((0, encoder.dim), dtype=np.float32)
        if index_type != "flat":
            rows = np.random.default_rng(seed).permutation(len(docs))[:train_size]
            sample = encoder.encode_passages([docs[i] for i in sorted(rows)], "train sample")
        index = make_index(encoder.dim, index_type, sample, **index_kwargs)
        # Chunks bound the memory for embeddings: 21M x 768 float32 would be 64 GB at once.
        for start in range(0, len(docs), chunk_size):
            chunk = docs[start : start + chunk_size]
            index.add(encoder.encode_passages(chunk, f"encode {start:,}+{len(chunk):,}"))
        return cls(encoder, index, DocStore(docs))

    @classmethod
    def from_corpus(
        cls, path: str | Path, encoder: Encoder, index_type: str = "flat", **kwargs: Any
    ) -> DenseRetriever:
        return cls.build(read_corpus(path), encoder, index_type, **kwargs)

    def save(self, folder: str | Path) -> None:
        """Write the index, the passage texts and the encoder settings into `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        import_faiss().write_index(self.index, str(folder / INDEX_FILE))
        self.docs.save(folder)
        enc = self.encoder
        config = {
            "kind": "dense",
            "encoder": str(Path(enc.path).resolve()),
            "query_prefix": enc.query_prefix,
            "passage_prefix": enc.passage_prefix,
            "max_length": enc.max_length,
            "nprobe": self.nprobe,
        }
        write_config(folder, config)

    @classmethod
    def load(
        cls,
        folder: str | Path,
        mmap: bool = True,
        encoder_path: str | Path | None = None,
        device: str | None = None,
        faiss_gpu: str = "off",
    ) -> DenseRetriever:
        """Open a saved index; `mmap=True` maps the vectors and texts instead of reading them.

        The encoder comes from the path saved in the folder unless `encoder_path` is given;
        `faiss_gpu`: where the index searches (`place_index`; the server passes its flag).
        """
        faiss = import_faiss()
        folder = Path(folder)
        config = read_config(folder, "dense")
        encoder = Encoder(
            encoder_path or config["encoder"],
            query_prefix=config["query_prefix"],
            passage_prefix=config["passage_prefix"],
            max_length=config["max_length"],
            device=device,
        )
        # IO_FLAG_MMAP_IFC maps the codes of flat and PQ indexes from the file (zero copy).
        flags = faiss.IO_FLAG_MMAP_IFC if mmap else 0
        index = faiss.read_index(str(folder / INDEX_FILE), flags)
        if index.d != encoder.dim:
            raise ValueError(
                f"{folder / INDEX_FILE}: vectors have dim {index.d}, encoder {encoder.dim}"
            )
        index, where = place_index(index, faiss_gpu)
        docs = DocStore.load(folder, mmap=mmap)
        return cls(encoder, index, docs, nprobe=config["nprobe"], index_where=where)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k docs per query by cosine similarity, best first; k is clamped to the corpus."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not queries:
            return []
        scores, ids = self.index.search(self.encoder.encode_queries(queries), min(k, len(self)))
        # IVF indexes pad a row with id -1 at its end when the probed lists hold fewer than k.
        valid = (ids >= 0).sum(axis=1).tolist()
        return self.docs.take(
            [row[:n] for row, n in zip(ids.tolist(), valid, strict=True)],
            [row[:n] for row, n in zip(scores.tolist(), valid, strict=True)],
        )
