"""Type stubs of ``mooncake.engine`` (upstream's API; see bindings/README.md).

Return conventions are upstream's: ``0`` success, ``-1`` failure (the (un)registration
calls return upstream's ``ERR_*`` codes: ``-1`` invalid, ``-3`` not registered, ``-7``
overlap); batch ids and addresses are ``0`` on failure. The reason of the calling
thread's last failed call is ``TransferEngine.last_error()``; every failure is also logged.
Arguments of the wrong type raise ``TypeError``. Every call that can block releases the GIL.
"""

from typing import Any, ClassVar, Dict, Final, List, Optional, Sequence, Union, final

# An object with the buffer protocol: a C-contiguous array of 8-byte integers
# (numpy int64/uint64, array('q'), ...).
_IntArray = Any

__version__: Final[str]

SUPPORT_CUDA: Final[bool]
SUPPORT_MUSA: Final[bool]
SUPPORT_EFA: Final[bool]
SUPPORT_HIP: Final[bool]
SUPPORT_MNNVL: Final[bool]
SUPPORT_INTRA_NVLINK: Final[bool]
SUPPORT_MULTI_PROTOCOL: Final[bool]

@final
class TransferOpcode:
    """Direction of a transfer: ``Read`` (remote to local) = 0, ``Write`` = 1."""

    Read: ClassVar["TransferOpcode"]
    Write: ClassVar["TransferOpcode"]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

Read: Final[TransferOpcode]
Write: Final[TransferOpcode]

_Opcode = Union[TransferOpcode, int]

@final
class ScatterTransferCompletionStatus:
    """How a scatter operation ended: ``COMPLETED`` = 0, ``FAILED_DRAINED`` = -1 (failed,
    nothing in flight), ``COMPLETION_UNKNOWN`` = -2 (not drained yet); upstream's values."""

    COMPLETED: ClassVar["ScatterTransferCompletionStatus"]
    FAILED_DRAINED: ClassVar["ScatterTransferCompletionStatus"]
    COMPLETION_UNKNOWN: ClassVar["ScatterTransferCompletionStatus"]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class ScatterTransferTicket:
    """Keeps a scatter operation's batch until it is drained."""

    @property
    def status(self) -> ScatterTransferCompletionStatus: ...
    @property
    def drained(self) -> bool: ...
    def drain(self, timeout_ms: int, /) -> ScatterTransferCompletionStatus:
        """Wait up to ``timeout_ms`` for the end; the status (``COMPLETION_UNKNOWN`` if it
        did not end in time). A failure's reason is ``TransferEngine.last_error()``."""

@final
class TransferNotify:
    """A notification sent after a transfer (``notify=``) and received by ``get_notifies()``."""

    name: str
    msg: str
    def __new__(cls, name: str = "", msg: str = "") -> "TransferNotify": ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class InnerTransferEngine:
    """The engine behind a ``TransferEngine``, shared with other components (``get_engine()``)."""

    @property
    def session_id(self) -> str: ...

@final
class TransferEngine:
    """A transfer engine: create, ``initialize(...)``, register memory, transfer.

    Calling ``initialize`` again starts a new engine (new RPC port and session id), carries
    every registration over to it and drops the old one (its in-flight batches fail); if the
    new engine cannot start, the old one stays and -1 is returned.

    ``nic_hint`` (the transfer calls' last argument): the local RDMA device that carries
    every request of the call; a device the engine does not use fails the call (-1). Over
    TCP or IPC any hint is accepted (no NIC to pick); ``""``: the topology chooses.
    ``transport_hint`` is accepted; the engine picks the transport per request.
    """

    TransferOpcode: ClassVar[type[TransferOpcode]]

    def __init__(self) -> None: ...
    @staticmethod
    def last_error() -> Optional[str]:
        """Why the calling thread's last call that reports failures (by return code) failed;
        ``None`` if that call succeeded."""

    @staticmethod
    def last_error_info() -> Optional[Dict[str, Any]]:
        """The typed cause of the calling thread's last failed call: ``kind``
        (``"rdma_unavailable"``, ``"protocol_not_served"``, ``"peer_unreachable"``,
        ``"address_rejected"``, ``"timeout"``, ``"invalid_argument"``, ``"memory"``, ...),
        ``fault`` (whose failure it is: ``"caller"``, ``"peer"`` or ``"host"``),
        ``message`` (what ``last_error()`` returns), ``call``, ``peer``, ``hint`` (the
        ``MC_*`` variable or ``mooncake-doctor`` check that helps) and ``code``; ``None``
        if that call succeeded."""

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Start the engine. ``metadata_server``: ``"P2PHANDSHAKE"`` (peers address this engine
        as ``f"{local_hostname}:{get_rpc_port()}"``). 0 / -1."""

    def initialize_ext(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str
    ) -> int: ...
    def get_rpc_port(self) -> int:
        """The handshake (RPC) port; -1 before ``initialize``."""

    def allocate_managed_buffer(self, length: int) -> int:
        """Registered host memory of at least ``length`` bytes; its address, or 0."""

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int: ...
    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "", nic_hint: str = ""
    ) -> int: ...
    def transfer_sync_read(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "", nic_hint: str = ""
    ) -> int: ...
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: _Opcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: _Opcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int:
        """Submit; the batch id, or 0."""

    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: _Opcode,
        transport_hint: str = "",
        nic_hint: str = "",
    ) -> int: ...
    # The *_arrays and *_pages calls take C-contiguous arrays of 8-byte integers through
    # the buffer protocol (read with one copy of their bytes, no Python object per entry);
    # a wrong dtype or shape raises TypeError / ValueError. 0 / -1, batch id or 0.
    def batch_transfer_sync_write_arrays(
        self, target_hostname: str, buffers: _IntArray, peer_buffer_addresses: _IntArray, lengths: _IntArray,
        transport_hint: str = "", nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_read_arrays(
        self, target_hostname: str, buffers: _IntArray, peer_buffer_addresses: _IntArray, lengths: _IntArray,
        transport_hint: str = "", nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_write_arrays(
        self, target_hostname: str, buffers: _IntArray, peer_buffer_addresses: _IntArray, lengths: _IntArray,
        transport_hint: str = "", nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_read_arrays(
        self, target_hostname: str, buffers: _IntArray, peer_buffer_addresses: _IntArray, lengths: _IntArray,
        transport_hint: str = "", nic_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_write_pages(
        self, target_hostname: str, src_pages: _IntArray, dst_pages: _IntArray, fields: _IntArray,
        max_batch_size: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> int:
        """``fields`` is an ``[F, 5]`` table of ``(src_base, src_stride, dst_base, dst_stride,
        length)``; request ``(f, i)`` moves ``length`` bytes from ``src_base + src_pages[i] *
        src_stride`` to ``dst_base + dst_pages[i] * dst_stride`` (src local, dst remote), in
        batches of at most ``max_batch_size`` (0: one). 0 / -1."""

    def batch_transfer_sync_read_pages(
        self, target_hostname: str, src_pages: _IntArray, dst_pages: _IntArray, fields: _IntArray,
        max_batch_size: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> int:
        """As the write form, data from src (remote) to dst (local)."""

    # Scatter: per region pair i, ranges j of lengths[i][j] bytes between local_base[i] +
    # local_offsets[i][j] and remote_base[i] + remote_offsets[i][j], each within both
    # capacities (else ValueError). submit_* returns at once; *_with_ticket returns drained.
    # A refused submission raises RuntimeError with the reason.
    def submit_scatter_write(
        self, endpoint: str, local_base_addresses: Sequence[int], local_capacities: Sequence[int],
        remote_base_addresses: Sequence[int], remote_capacities: Sequence[int],
        local_offsets: Sequence[Sequence[int]], remote_offsets: Sequence[Sequence[int]],
        lengths: Sequence[Sequence[int]],
    ) -> ScatterTransferTicket: ...
    def submit_scatter_read(
        self, endpoint: str, local_base_addresses: Sequence[int], local_capacities: Sequence[int],
        remote_base_addresses: Sequence[int], remote_capacities: Sequence[int],
        local_offsets: Sequence[Sequence[int]], remote_offsets: Sequence[Sequence[int]],
        lengths: Sequence[Sequence[int]],
    ) -> ScatterTransferTicket: ...
    def scatter_transfer_sync_write_with_ticket(
        self, endpoint: str, local_base_addresses: Sequence[int], local_capacities: Sequence[int],
        remote_base_addresses: Sequence[int], remote_capacities: Sequence[int],
        local_offsets: Sequence[Sequence[int]], remote_offsets: Sequence[Sequence[int]],
        lengths: Sequence[Sequence[int]],
    ) -> ScatterTransferTicket: ...
    def scatter_transfer_sync_read_with_ticket(
        self, endpoint: str, local_base_addresses: Sequence[int], local_capacities: Sequence[int],
        remote_base_addresses: Sequence[int], remote_capacities: Sequence[int],
        local_offsets: Sequence[Sequence[int]], remote_offsets: Sequence[Sequence[int]],
        lengths: Sequence[Sequence[int]],
    ) -> ScatterTransferTicket: ...
    # *_on_cuda: the transfer runs after the work queued on stream_ptr (a cudaStream_t as
    # an integer; 0 the default stream) and before the call returns, so later work on
    # the stream follows it. The calling thread waits (GIL released); upstream instead
    # queues a host function and returns at once. Failures raise RuntimeError (no CUDA
    # runtime, a stream error, the transfer's reason).
    def transfer_write_on_cuda(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        stream_ptr: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> None: ...
    def transfer_read_on_cuda(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        stream_ptr: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> None: ...
    def batch_transfer_write_on_cuda(
        self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int], stream_ptr: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> None: ...
    def batch_transfer_read_on_cuda(
        self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int], stream_ptr: int = 0, transport_hint: str = "", nic_hint: str = "",
    ) -> None: ...
    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Wait for every batch (each until its deadline) and free them: 0 / -1."""

    def transfer_submit_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "", nic_hint: str = ""
    ) -> int: ...
    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed (freed), 0 in progress, -1 failed (freed) or unknown id, -2 timed out."""

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: Union[bytes, bytearray], length: int) -> int: ...
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes: ...
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int: ...
    def unregister_memory(self, buffer_addr: int) -> int: ...
    def batch_register_memory(
        self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = "*"
    ) -> int: ...
    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int: ...
    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """The local topology as JSON: location -> [preferred HCAs, available HCAs], narrowed by
        ``MC_TE_FILTERS`` and ``device_name`` (comma list) as ``initialize`` narrows it.
        Raises ``ValueError`` on a bad ``MC_*`` value or an unusable ``MC_CUSTOM_TOPO_JSON``."""

    def get_first_buffer_address(self, segment_name: str) -> int: ...
    def get_notifies(self) -> List[TransferNotify]: ...
    def send_probe(self, peer_server_name: str) -> int: ...
    def warmup_efa_segment(self, segment_name: str) -> int: ...
    def get_metrics(self) -> Dict[str, Any]:
        """Transfer metrics of this engine (as initiator), always on. Raises ``RuntimeError``
        before ``initialize``. Shape::

            {
              "transports": {            # per transport, by protocol ("tcp", "rdma", ...)
                "tcp": {
                  "bytes_read": int, "bytes_written": int,   # of completed requests
                  "requests": int,                           # finished, completed or failed
                  "failures": {kind: int},  # peer_unreachable, peer_lost, address_rejected,
                                            # protocol, local_not_registered, timeout, canceled
                  "connects": int, "reconnects": int, "retries": int,  # TCP, RDMA; IPC: connects
                  "served_bytes_read": int,      # peers read from / wrote into our memory
                  "served_bytes_written": int,   # (TCP only: RDMA and IPC bypass our threads)
                  "request_latency": {"count": int, "sum_seconds": float},
                  "batch_latency": {"count": int, "sum_seconds": float},
                },
              },
              "peers": {                 # per peer segment name; beyond peer_cap: "other"
                "host:port": {"bytes_read": int, "bytes_written": int, "requests": int,
                              "failures": {kind: int}},
              },
              "peer_cap": int,
            }
        """
    def get_engine(self) -> Optional[InnerTransferEngine]: ...
    def get_engine_ptr(self) -> int: ...

class SharedSegment:
    """Not served by this engine: ``supported()`` is False, ``create`` raises
    ``RuntimeError`` saying so."""

    def __init__(self) -> None: ...
    @staticmethod
    def supported(mmap: bool = True, host_register: bool = False) -> bool: ...
    @staticmethod
    def create(
        name: str,
        size: int,
        world_size: int,
        rank_id: int,
        owner_rank: int = 0,
        device_id: int = 0,
        mmap: bool = True,
        host_register: bool = False,
    ) -> Any: ...

class ReceivedData:
    def __init__(self) -> None: ...

class ReceivedTensor:
    def __init__(self) -> None: ...

class RpcInterface:
    """Not served by this engine (upstream's coro_rpc messaging): constructing one raises
    ``RuntimeError`` saying so."""

    def __init__(self) -> None: ...

CoroRPCInterface = RpcInterface

def create_rpc_client(local_rank: int = 0, world_size: int = 1) -> RpcInterface: ...
def create_rpc_server(local_rank: int = 0, world_size: int = 1) -> RpcInterface: ...

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MULTI_PROTOCOL",
    "SUPPORT_MUSA",
    "CoroRPCInterface",
    "InnerTransferEngine",
    "Read",
    "ReceivedData",
    "ReceivedTensor",
    "RpcInterface",
    "ScatterTransferCompletionStatus",
    "ScatterTransferTicket",
    "SharedSegment",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "__version__",
    "create_rpc_client",
    "create_rpc_server",
]
