"""Piecewise compilation: the traced forward split at the attention ops, each piece between them compiled apart.

Mirrors vllm/compilation/backends.py (`split_graph`, `PiecewiseCompileInterpreter`, `VllmBackend`): Dynamo hands
the backend ONE graph of the whole forward; it is cut at every `splitting_ops` node (mini has one such op,
`mini::unified_attention`, mini/attention/unified_attention.py), giving pieces p0, attention, p1, attention, ...,
pN. The attention pieces run as they are (the op's eager body); each other piece goes through inductor alone.

What the split buys in mini: compile time. The pieces between two attention calls (o_proj, residual, MLP, the
next layer's norm, q/k/v and RoPE) are the same graph in every layer, so inductor compiles the first and finds
the others in its cache (vLLM reuses identical pieces the same way: `CompilerManager.compile`'s cache-key check,
and `StandaloneCompiledArtifacts` in vllm/compilation/caching.py). For inductor's cache to see them as equal,
each piece's inputs are renamed `arg0, arg1, ...` first: `split_module` names them after the nodes of the
whole graph, which carry the layer's number. What vLLM also does with the pieces and mini does not: capture
each as a piecewise CUDA graph (mini captures whole decode steps, mini/worker/cuda_graph.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

__all__ = ["ATTENTION_OPS", "make_piecewise_backend", "split_graph"]

# vLLM: CompilationConfig._attention_ops (its unified attention ops); mini's one attention op.
ATTENTION_OPS = ("mini::unified_attention",)


def _op_name(node: torch.fx.Node) -> str | None:
    """`namespace::name` of a call to a custom op (an OpOverload or its packet), else None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "name", None)   # OpOverload.name() -> "mini::unified_attention" (overload dropped)
    if callable(name):
        return name().split(".")[0]
    packet = getattr(node.target, "_qualified_op_name", None)  # an OpOverloadPacket
    return packet


def split_graph(graph: torch.fx.GraphModule, splitting_ops: Sequence[str]
                ) -> tuple[torch.fx.GraphModule, list[str], list[str]]:
    """Cut `graph` at every node calling one of `splitting_ops` -> (split module, pieces to compile, split-op pieces).

    Nodes get increasing piece ids in graph order; a splitting node gets a piece of its own (as vLLM's
    `split_graph`; mini never has two attention calls in a row to keep together). `keep_original_order` keeps
    the nodes' order inside each piece, as vLLM's comment on mutations asks.
    """
    piece_of: dict[str, int] = {}
    split_pieces: set[int] = set()
    piece = 0
    for node in graph.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if _op_name(node) in splitting_ops:
            piece += 1
            piece_of[node.name] = piece
            split_pieces.add(piece)
            piece += 1
        else:
            piece_of[node.name] = piece
    split = split_module(graph, None, lambda node: piece_of[node.name], keep_original_order=True)
    names = [name for name, _ in split.named_children()]
    split_names = [f"submod_{piece}" for piece in sorted(split_pieces)]
    return split, [name for name in names if name not in split_names], split_names


def _canonical_inputs(piece: torch.fx.GraphModule) -> None:
    """Rename the piece's inputs `arg0, arg1, ...` (in place) so equal pieces of different layers read the same."""
    for index, node in enumerate(n for n in piece.graph.nodes if n.op == "placeholder"):
        node.name = node.target = f"arg{index}"
    piece.recompile()


class _CompiledPiece(torch.nn.Module):
    """A compiled piece in the split module's place of the original submodule (called with the same args)."""

    def __init__(self, compiled: Any) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)


class _PiecewiseCompileInterpreter(torch.fx.Interpreter):
    """Runs the split module on fake inputs; each piece to compile is compiled with the inputs it receives there
    (their shapes, symbolic sizes included), then put in the module in its place (vLLM: the same-named class)."""

    def __init__(self, module: torch.fx.GraphModule, compile_names: list[str]) -> None:
        super().__init__(module)
        self.compile_names = set(compile_names)

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        output = super().call_module(target, args, kwargs)
        if target in self.compile_names:
            from torch._inductor.compile_fx import compile_fx

            piece = getattr(self.module, target)
            _canonical_inputs(piece)
            setattr(self.module, target, _CompiledPiece(compile_fx(piece, list(args))))
        return output


@functools.cache
def make_piecewise_backend(splitting_ops: tuple[str, ...]):
    """A torch.compile backend: split at `splitting_ops`, inductor over each other piece (vLLM: `VllmBackend`).

    One backend per `splitting_ops`, shared by every engine in the process: Dynamo reuses a traced graph only for
    the same backend object, so a second engine of the same shapes then runs the first one's graph (the weights
    are the graph's inputs, not constants in it)."""

    def piecewise_backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
        from torch._guards import detect_fake_mode

        split, compile_names, _ = split_graph(graph, splitting_ops)
        fake_mode = detect_fake_mode(example_inputs)
        # Dynamo lifts the weights as real tensors among the example inputs: the pieces must see fakes only.
        fake_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor)
                       and not isinstance(x, torch._subclasses.FakeTensor) else x for x in example_inputs]
        with fake_mode:
            _PiecewiseCompileInterpreter(split, compile_names).run(*fake_inputs)
        return split

    return piecewise_backend
