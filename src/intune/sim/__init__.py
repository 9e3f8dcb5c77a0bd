"""The simulator of pipelines and machines, workload specs, resize schedules and the oracle.

The paper's machines had 32-128 CPUs; ours have 2. The simulator is how the agent is pretrained and how
the baselines are compared at that scale. Its throughput model is in
``intune.sim.model`` (read its docstring for the formulas); workload specs are data (``docs/workloads.md``).

Stable API (the agent and the policies rely on these names)::

    from intune.sim import (Simulator, load_workload, list_workloads, paper_schedule, random_workload,
                            run_episode)

    spec = load_workload("criteo")           # a shipped name (list_workloads()) or a .yaml/.json path;
    spec = load_workload("production", cpus=64, batch_size=8192)   # variants by parameters
    sim = Simulator(spec, cpus=paper_schedule(period_ticks=600),   # or an int, or None (spec's CPUs)
                    memory_limit_gb=None, seed=0, dt_s=1.0,        # None: the spec's value
                    model_latency_s=None, noise=0.02)
    sim.knobs           # dict[str, intune.knobs.Knob]: "<stage>.workers" (cpu, 1..max_workers) and
                        # "<stage>.buffer_mb" (mb, for stages whose spec declares a buffer)
    obs = sim.reset()   # tick 0 -> intune.monitor.observation.Observation; knobs back to the spec's defaults
                        # (1 worker per stage, default buffers); reset(seed=...) restarts the streams
    obs = sim.step()    # one tick with the current knob values; obs.oom is True on the tick the job is
                        # killed; then throughput is 0 for restart_delay_s and buffers start empty
    sim.true_throughput(alloc, cpus)   # noise-free model rows/s of {knob: value} (missing: current)
    sim.optimum(cpus)                  # (alloc, rows/s): the oracle's exact search, current drift
    sim.last_model_throughput, sim.last_cpu_used, sim.last_memory_bytes, sim.ooms   # after each step
    result = run_episode(sim, policy, ticks)   # reset, then per tick policy.step -> clamp_request ->
                                               # knob.set -> sim.step; EpisodeResult with per-tick arrays
                                               # (throughput, model_throughput, cpus, cpu_used,
                                               # memory_bytes, oom, knobs) and summary()
    spec2 = random_workload(rng, n_stages=None, cpus=None)   # random valid specs for pretraining

    # a map stage's spec may carry a remote pool (``remote``: nodes, cpus_per_node, bandwidth_mb_s,
    # latency_ms, cost_factor, node_loss; intune.sim.remote, docs/remote_tuning.md): the knob
    # "<stage>.remote_workers" (cpu, 0..nodes * cpus_per_node), obs.remote_cpus and the stage's remote fields
    sim.remote_pool                    # the RemotePool, or None (then nothing changes: same numbers)
    sim.remote_capacity(workers)       # each stage's remote rows/s with that many workers on the live nodes
    sim.lose_nodes(n)                  # lose the first n live nodes now, with their workers
    sim.set_model_latency(seconds)     # the trainer's step time (its demand) from the next tick on

The oracle is ``intune.sim.oracle.OraclePolicy`` (registry name ``"oracle"``): build it with
``OraclePolicy(sim=sim)`` or let ``run_episode`` bind it (it calls ``bind_simulator(sim)`` on any policy
that has one). Observations are exactly the live tuner's: per stage items_per_s, rows_per_s,
cpu_s_per_item, wall_s_per_item (busy wall time per item: GIL waits and descheduling count),
bytes_per_item, busy / starved / blocked fractions, queue_fill, buffered_bytes; globally throughput
(rows/s), step_time_s (model latency), cpus, memory used / limit (the cgroup), host_memory_free_bytes
(the host's, larger than the limit: what tf.data reads), demand, cpu_ghz, mem_bandwidth_gbs.
Rates, costs and memory carry multiplicative measurement noise of relative size ``noise``.
"""

from intune.sim.episode import EpisodeResult, convergence_ticks, run_episode
from intune.sim.random_specs import random_pipeline_spec, random_workload
from intune.sim.schedule import CpuSchedule, constant_schedule, paper_schedule, stepped_schedule
from intune.sim.simulator import Simulator
from intune.sim.spec import (
    SpecError,
    WorkloadSpec,
    ladder_workload,
    list_workloads,
    load_workload,
    spec_from_dict,
    workload_variant,
)

__all__ = [
    "CpuSchedule",
    "EpisodeResult",
    "Simulator",
    "SpecError",
    "WorkloadSpec",
    "constant_schedule",
    "convergence_ticks",
    "ladder_workload",
    "list_workloads",
    "load_workload",
    "paper_schedule",
    "random_pipeline_spec",
    "random_workload",
    "run_episode",
    "spec_from_dict",
    "stepped_schedule",
    "workload_variant",
]
