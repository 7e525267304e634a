"""Training: losses, the policy-gradient family (advantages and policy losses by name), the PPO loop, PPO's
critic, sequence packing, the train engines (DeepSpeed ZeRO / AutoTP, plain torch), the train stage's body,
its launch on N processes and their optimizer state, and the supervised warm-up.

May import: schema, artifacts, models, run, generation.
"""
