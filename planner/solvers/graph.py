"""Op graphs: a DAG of forward operations, each with what its backward reads.

Checkmate's model (Jain et al. 2020, "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", §4.1): every node computes one output tensor from its inputs; the training
graph adds, for every node, a backward operation that reads the gradient of the node's output
and some of the node's inputs and output, and writes the gradients of its inputs. We keep the
backward implicit (it runs once per node, in reverse topological order) and record what it
reads: `bwd_inputs` (which producers' outputs), `bwd_output` (its own output) and an optional
private tensor `saved_extra_bytes` (e.g. a dropout mask or layer-norm statistics; for a coarse
chain layer, everything it saves beyond its input), which exists only when the node's forward
runs with `keep_saved` (Rotor's "store all", Beaumont et al. 2019 §3).

Nodes are listed in topological order: a node's inputs have smaller indices. Graph inputs are
nodes with `is_input=True`: present from the start, never recomputed, without a backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .chain import LayerChain, check_nonnegative


class TensorPart(StrEnum):
    """Which tensor of a node: its output, or the private tensor its backward keeps."""

    OUTPUT = "output"
    SAVED = "saved"


@dataclass(frozen=True, kw_only=True, slots=True)
class GraphOp:
    """One forward operation of an op graph."""

    name: str
    """Op name, e.g. ``"fc1"``."""
    output_bytes: float
    """Bytes of the node's output tensor."""
    inputs: tuple[int, ...] = ()
    """Indices of the nodes whose outputs this node reads (all smaller than its own)."""
    fwd_s: float = 0.0
    """Forward time (what each recomputation costs)."""
    bwd_s: float = 0.0
    """Backward time."""
    bwd_inputs: tuple[int, ...] = ()
    """Which of `inputs` the backward reads (e.g. a matmul reads its activation input)."""
    bwd_output: bool = False
    """Whether the backward reads the node's own output (e.g. softmax)."""
    saved_extra_bytes: float = 0.0
    """Bytes of the private tensor the backward reads, kept only by a `keep_saved` forward."""
    autograd_state: bool = False
    """The backward needs the state a `keep_saved` forward leaves, as in PyTorch, where a
    layer's backward exists only after its forward ran with grad enabled (even when it saves
    nothing beyond its input); that state, the private saved tensor (maybe of 0 bytes), holds
    the tensors the backward reads, which stay on the device while it does (Rotor's stored x̄
    includes the layer's input). False is Checkmate's model: the backward reads tensors, each
    kept or recomputed on its own."""
    fwd_tmp_bytes: float = 0.0
    """Transient bytes inside the forward."""
    bwd_tmp_bytes: float = 0.0
    """Transient bytes inside the backward."""
    is_input: bool = False
    """A graph input: present at the start, never recomputed, no backward of its own."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpGraph:
    """A DAG of `GraphOp`s in topological order."""

    nodes: tuple[GraphOp, ...]
    """The nodes; a node's `inputs` index earlier nodes."""
    name: str = "graph"
    """Human name for messages and reports."""

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not self.nodes:
            raise ValueError(
                f"graph {self.name!r}: nodes={self.nodes!r} must be a non-empty tuple of "
                "GraphOp; pass at least one node"
            )
        for i, node in enumerate(self.nodes):
            _check_node(self.name, i, node)
        if all(node.is_input for node in self.nodes):
            raise ValueError(
                f"graph {self.name!r} has only input nodes; add at least one operation"
            )

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def compute_nodes(self) -> tuple[int, ...]:
        """Indices of the non-input nodes, in topological (forward) order."""
        return tuple(i for i, node in enumerate(self.nodes) if not node.is_input)

    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For every node, the nodes that read its output (each listed once)."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for j, node in enumerate(self.nodes):
            for i in dict.fromkeys(node.inputs):
                users[i].append(j)
        return tuple(tuple(u) for u in users)

    def sinks(self) -> tuple[int, ...]:
        """Non-input nodes nobody reads: their output gradients are the backward seeds."""
        users = self.consumers()
        return tuple(i for i in self.compute_nodes if not users[i])

    def tensor_bytes(self, node: int, part: TensorPart) -> float:
        """Size of one tensor."""
        n = self.nodes[node]
        return n.output_bytes if part == TensorPart.OUTPUT else n.saved_extra_bytes

    def bwd_reads(self, node: int) -> tuple[tuple[int, TensorPart], ...]:
        """The forward tensors the backward of `node` reads."""
        n = self.nodes[node]
        reads = [(i, TensorPart.OUTPUT) for i in dict.fromkeys(n.bwd_inputs)]
        if n.bwd_output and node not in n.bwd_inputs:
            reads.append((node, TensorPart.OUTPUT))
        if self.has_saved(node):
            reads.append((node, TensorPart.SAVED))
        return tuple(reads)

    def has_saved(self, node: int) -> bool:
        """Whether a `keep_saved` forward of `node` leaves a private saved tensor."""
        n = self.nodes[node]
        return n.saved_extra_bytes > 0 or n.autograd_state

    def holds(self, node: int) -> tuple[int, ...]:
        """Nodes whose outputs `node`'s private saved tensor holds (see `autograd_state`)."""
        if not self.nodes[node].autograd_state:
            return ()
        return tuple(i for i, part in self.bwd_reads(node) if part == TensorPart.OUTPUT)

    @property
    def store_all_makespan_s(self) -> float:
        """One forward and one backward per node, no recomputation."""
        return sum(n.fwd_s + n.bwd_s for n in self.nodes)


def _check_node(graph: str, index: int, node: GraphOp) -> None:
    owner = f"graph {graph!r} node {index} ({node.name!r})"
    for field, unit in (
        ("output_bytes", "bytes"),
        ("fwd_s", "seconds"),
        ("bwd_s", "seconds"),
        ("saved_extra_bytes", "bytes"),
        ("fwd_tmp_bytes", "bytes"),
        ("bwd_tmp_bytes", "bytes"),
    ):
        check_nonnegative(owner, field, getattr(node, field), unit)
    for i in node.inputs:
        if not isinstance(i, int) or not 0 <= i < index:
            raise ValueError(
                f"{owner}: input {i!r} must be the index of an earlier node (0..{index - 1}); "
                "list nodes in topological order"
            )
    for i in node.bwd_inputs:
        if i not in node.inputs:
            raise ValueError(
                f"{owner}: bwd_inputs has {i!r}, which is not among inputs={node.inputs!r}; "
                "a backward can only read the node's own inputs"
            )
    if node.is_input and (
        node.inputs
        or node.fwd_s
        or node.bwd_s
        or node.saved_extra_bytes
        or node.bwd_output
        or node.fwd_tmp_bytes
        or node.bwd_tmp_bytes
        or node.autograd_state
    ):
        raise ValueError(
            f"{owner}: an input node only has a name and output_bytes (no inputs, times, saved "
            "or transient bytes); make it a regular node if it computes something"
        )
    if not node.is_input and not node.inputs:
        raise ValueError(
            f"{owner} has no inputs; add an input node (is_input=True) for the data it reads"
        )


def chain_to_graph(chain: LayerChain) -> OpGraph:
    """A chain as a path graph: node 0 is the chain's input, node l (1-based) is layer l-1.

    Each layer's backward reads its input (`saved_bytes` includes it) and its private tensor of
    `saved_bytes - input_bytes`, kept when the forward runs with `keep_saved`; it is the
    layer's autograd state (`autograd_state`): the backward needs it even when it has 0 bytes
    and it holds the input, so "store all" keeps the input too, as in Rotor.
    """
    nodes = [GraphOp(name="input", output_bytes=chain.input_bytes, is_input=True)]
    for index, layer in enumerate(chain.layers):
        nodes.append(
            GraphOp(
                name=layer.name,
                output_bytes=layer.output_bytes,
                inputs=(index,),
                fwd_s=layer.fwd_s,
                bwd_s=layer.bwd_s,
                bwd_inputs=(index,),
                saved_extra_bytes=layer.extra_saved_bytes,
                autograd_state=True,
                fwd_tmp_bytes=layer.fwd_tmp_bytes,
                bwd_tmp_bytes=layer.bwd_tmp_bytes,
            )
        )
    return OpGraph(nodes=tuple(nodes), name=chain.name)
