"""A map stage's remote pool in the simulator: nodes, the workers placed on them, and what they deliver.

Owns the pool's state over ticks (live nodes, workers running, node losses) and the arithmetic of its
capacity; the simulator (``intune.sim.simulator``) adds that capacity to the stage and fills the
Observation's remote fields, the model (``intune.sim.model``) turns it into throughput and local CPU,
the oracle searches over worker counts with ``capacity_rows``. It must not choose a worker count.

The rules (``RemotePoolSpec`` gives the numbers):

- **Placement.** One worker per CPU, packed: worker ``k`` runs on the ``k // cpus_per_node``-th live
  node. Packing is Ray's default for actors that fit on a node and the worst case for a node loss (a
  lost node takes all the workers it held).
- **A chunk's time** on a remote worker is ``compute + latency + bytes / bandwidth``: ``compute`` the
  chunk's rows times the stage's per-row CPU and I/O cost (the CPU part times ``cost_factor`` and the
  drift multiplier), ``bytes`` the chunk in (the previous stage's bytes) and out (the stage's own). The
  transfer holds the remote worker but no CPU of this machine.
- **Bandwidth is per node.** Every node has a link of ``bandwidth_mb_s`` MB/s that its workers share:
  a node moves at most ``bandwidth / bytes`` chunks a second, whatever its worker count. Past that, its
  chunks queue on the link and their transit time grows (``transfer_s``). The trainer's own link is not
  modelled: at 64 nodes it would be the next bound, a real cluster's to measure.
- **Node loss** at tick ``t`` removes the first live nodes and the workers on them; the running count
  (the knob's value) falls to the workers left, and the pool's CPUs (``Observation.remote_cpus``: this
  cluster is the pipeline's own, so free plus held is every live CPU) fall by the nodes' CPUs.
- **Start.** A worker asked for runs from the next tick, like a local one (an actor starts in about a
  second: one tick). Remote workers take no memory of this machine.
"""

from __future__ import annotations

from intune.sim.spec import RemotePoolSpec
from intune.units import MB


class RemotePool:
    """The remote pool of stage ``stage`` (index into the spec's stages); ``reset`` restores every node."""

    def __init__(self, spec: RemotePoolSpec, stage: int, rows_per_item: float, bytes_in: float, bytes_out: float) -> None:
        self.spec = spec
        self.stage = stage
        self.rows_per_item = float(rows_per_item)
        self.bytes_per_item = float(bytes_in + bytes_out)  # both ways
        self._link_items_per_s = spec.bandwidth_mb_s * MB / self.bytes_per_item  # one node's link
        self._transit_s = spec.latency_ms * 1e-3 + self.bytes_per_item / (spec.bandwidth_mb_s * MB)
        self.reset()

    def reset(self) -> None:
        self.live_nodes = self.spec.nodes
        self.workers = 0

    # ---------------------------------------------------------------------------------------- state
    @property
    def cpus(self) -> int:
        """CPUs of the live nodes: what the pipeline may hold (``Observation.remote_cpus``)."""
        return self.live_nodes * self.spec.cpus_per_node

    def set_workers(self, value: int) -> None:
        """Run ``value`` workers, or as many as the live nodes' CPUs hold."""
        self.workers = max(0, min(int(value), self.cpus))

    def lose_nodes(self, nodes: int) -> int:
        """Lose the first ``nodes`` live nodes and the workers on them; returns the workers lost."""
        nodes = max(0, min(int(nodes), self.live_nodes))
        lost = min(self.workers, nodes * self.spec.cpus_per_node)  # packed: the first nodes are the fullest
        self.workers -= lost
        self.live_nodes -= nodes
        return lost

    def losses_at(self, tick: int) -> int:
        """Nodes the spec loses at ``tick``."""
        return self.spec.node_loss.get(tick, 0)

    # ----------------------------------------------------------------------------------- arithmetic
    def chunk_compute_s(self, cpu_s_per_row: float, io_s_per_row: float) -> float:
        """Seconds a remote worker computes on one chunk: its rows at the stage's per-row costs (the CPU
        part, already times the drift multiplier, times ``cost_factor``)."""
        return self.rows_per_item * (cpu_s_per_row * self.spec.cost_factor + io_s_per_row)

    def node_items_per_s(self, workers_on_node: int, compute_s: float) -> float:
        """Chunks a second a node delivers with this many workers: each worker one chunk per
        ``compute + transit``, the node's link at most ``bandwidth / bytes``."""
        if workers_on_node <= 0:
            return 0.0
        return min(workers_on_node / (compute_s + self._transit_s), self._link_items_per_s)

    def capacity_items(self, workers: int, compute_s: float) -> float:
        """Chunks a second ``workers`` packed workers deliver (full nodes, then the last one's rest)."""
        workers = max(0, min(int(workers), self.cpus))
        full, rest = divmod(workers, self.spec.cpus_per_node)
        per_node = self.node_items_per_s(self.spec.cpus_per_node, compute_s)
        return full * per_node + self.node_items_per_s(rest, compute_s)

    def capacity_rows(self, workers: int, cpu_s_per_row: float, io_s_per_row: float) -> float:
        """Rows a second ``workers`` packed workers deliver at these per-row costs."""
        return self.capacity_items(workers, self.chunk_compute_s(cpu_s_per_row, io_s_per_row)) * self.rows_per_item

    def transfer_s(self, delivered_items_per_s: float, compute_s: float) -> float:
        """Mean seconds a chunk spends in transit when the pool delivers ``delivered_items_per_s``: the
        latency and its bytes at the link's speed, plus the queueing on a node whose link is saturated
        (the worker then waits ``workers * bytes / bandwidth`` a chunk, of which ``compute`` is its own)."""
        if self.workers <= 0 or delivered_items_per_s <= 0:
            return 0.0
        full, rest = divmod(self.workers, self.spec.cpus_per_node)
        waits, weights = 0.0, 0.0
        for count, nodes in ((self.spec.cpus_per_node, full), (rest, 1 if rest else 0)):
            if nodes == 0:
                continue
            rate = self.node_items_per_s(count, compute_s) * nodes
            cycle = count / self.node_items_per_s(count, compute_s)  # seconds a worker spends per chunk
            waits += rate * max(self._transit_s, cycle - compute_s)
            weights += rate
        return waits / weights if weights > 0 else self._transit_s


def remote_pool_of(spec, rows_per_item, bytes_per_item) -> RemotePool | None:
    """The pool of the spec's remote stage (at most one), or None. ``rows_per_item`` and
    ``bytes_per_item`` are the model's per-stage arrays (a chunk's bytes in are the previous stage's
    bytes per row times its rows)."""
    for i, s in enumerate(spec.stages):
        if s.remote is None:
            continue
        rows = float(rows_per_item[i])
        out = float(bytes_per_item[i])
        if i > 0:
            bytes_in = float(bytes_per_item[i - 1]) / float(rows_per_item[i - 1]) * rows
        else:
            bytes_in = spec.bytes_per_row * rows
        return RemotePool(s.remote, i, rows, bytes_in, out)
    return None


def workers_on_nodes(workers: int, cpus_per_node: int) -> list[int]:
    """The packed placement: workers on each used node, first node first."""
    full, rest = divmod(max(0, int(workers)), cpus_per_node)
    return [cpus_per_node] * full + ([rest] if rest else [])


__all__ = ["RemotePool", "remote_pool_of", "workers_on_nodes"]
