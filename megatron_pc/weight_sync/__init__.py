"""Weight sync: how the policy's weights travel from policy rank 0 to the engine actors.

A bucket is a list of (HF name, full tensor). Three transports move it
(``rollout.weight_transport``, one type each in :mod:`.transports`, registered by exact name;
the driver side is :func:`megatron_pc.weight_sync.sync.sync_weights`):

- ``object_store``: the bucket goes through Ray's object store (CPU tensors). Needs no channel.
- ``broadcast``: policy rank 0 (rank 0 of the group) and every engine actor (ranks 1..E)
  form a process group of their own, made directly from a ``TCPStore`` that rank 0 hosts, so
  the default process group that the Megatron ranks (and vLLM) already use is left alone.
  Gloo on CPU, NCCL on GPU. Each bucket is packed into one byte buffer and broadcast; the
  receivers learn its layout from the bucket's metadata (a list of :class:`TensorMeta`),
  which travels separately (through Ray in the driver).
- ``cuda_ipc``: colocated on one GPU, rank 0 packs the bucket on its GPU and hands the
  engine a CUDA IPC handle of the buffer (``torch.multiprocessing.reductions.reduce_tensor``);
  the engine maps the same memory, loads it, and acknowledges through the store. The sender
  keeps at most :data:`IPC_WINDOW` buckets alive and frees one only after its acknowledgement.

Every wait has a timeout: a receiver that never joins or stops receiving makes the sender
fail with a :class:`TransportError` naming the engines, the bucket and its first tensor
instead of hanging.

Known limit: the receivers are the engine *actor* processes, which hold the vLLM model only
when the engine runs in-process (TP=1, VLLM_ENABLE_V1_MULTIPROCESSING=0). Engines with TP>1
would need the receive to happen in vLLM's worker processes (through ``collective_rpc``);
that is not done (see docs/weight_sync.md).


    buckets.py     what a bucket is, its metadata, packing into one buffer, layer boundaries
    rendezvous.py  the TCPStore where a channel's two ends meet; timed waits
    broadcast.py   the broadcast channel's sender and receiver
    cuda_ipc.py    the CUDA IPC channel's sender and receiver
    transports.py  the transports by name: their worker methods and channel ends
    sync.py        the driver's side: stream the buckets into every engine

The worker ends are methods of megatron_pc.cluster.workers (MegatronRank sends, EngineActor
loads), which call into this package.
"""
