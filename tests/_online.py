"""Run a policy with online fine-tuning on a simulator, as the live tuner would (shared by tests)."""


def fine_tune(policy, sim, ticks: int, reward: float = 0.5):
    """``ticks`` decisions on ``sim``, each followed by ``policy.observe`` with a constant reward."""
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    for _ in range(ticks):
        for name, value in policy.step(obs).items():
            sim.knobs[name].set(sim.knobs[name].clamp(value))
        obs = sim.step()
        policy.observe(obs, reward)
    return policy
