"""Weight sync: how the policy's weights travel from the policy to every engine worker.

This package owns both ends of every transport. A bucket is a list of (HF name, full tensor)
ending at a layer boundary. Each transport (``rollout.weight_transport``, registered by exact
name in :mod:`.transports`) is a :class:`~.channel.Sender` that a policy rank holds and a
:class:`~.channel.Receiver` that each vLLM worker of each engine holds; per bucket the sender
yields one typed :class:`~.channel.BucketPayload`, which the driver hands to every engine
(``sink.update_weights(payload)``, :class:`~.sync.WeightSync`) and each worker turns back into
tensors:

- ``object_store``: the payload carries the bucket's CPU tensors (Ray's object store moves
  it). Workers acknowledge each bucket; the sender puts bucket k+2 only after every worker
  acknowledged bucket k (at most two buckets in flight, counted by :class:`~.channel.Window`).
- ``broadcast``: the payload is the bucket's metadata; the bytes go over a process group of
  policy rank 0 and every engine worker, made directly from the channel's ``TCPStore`` (gloo
  on CPU, NCCL on GPU), so the default process groups of Megatron and vLLM are left alone.
- ``cuda_ipc`` (per GPU): every policy rank gathers the full tensors in its TP group and packs
  each bucket on its GPU; the payload (a ``PerGpuBucket``) holds every rank's CUDA IPC handle,
  and the worker on each GPU maps the one on its GPU, loads it and acknowledges; each rank
  frees a buffer only after the acknowledgement and keeps at most two alive.

Every wait has a timeout; a peer that never joins or stops acknowledging makes the sender fail
with a :class:`~.buckets.TransportError` naming it and the bucket. The driver aborts a sync in
which an engine failed (:meth:`~.rendezvous.Rendezvous.abort`).

    buckets.py      what a bucket is, its metadata, packing into one buffer, layer boundaries
    rendezvous.py   the TCPStore where a channel's ends meet; announcements, acks, abort
    channel.py      payload, channel spec, window of buckets in flight, Sender / Receiver
    object_store.py the object store's sender and receiver
    broadcast.py    the broadcast channel's sender and receiver
    cuda_ipc.py     the CUDA IPC channel's sender and receiver
    transports.py   the transports by name: their sender and receiver types
    sending.py      the policy rank's end (SendingRank, which the rank's actor inherits): open,
                    connect and close its sender, stream its weights
    engine_side.py  what runs in each vLLM worker (collective_rpc): join, load a bucket, leave
    sync.py         the driver's side: the Source (policy) and Sink (engines) protocols, and
                    WeightSync, which holds the open channel and hands each payload to the engines
"""
