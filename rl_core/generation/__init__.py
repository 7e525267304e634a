"""Generation and episodes: the rollout engines (vLLM in-process, vLLM servers, HF), the generate stage's body
(prompts, sampling, multi-turn episodes), the curriculum that picks prompts, and the execute_envs stage's
body (every episode replayed into a fresh environment, its outcome stored).

May import: schema, artifacts, models, run.
"""
