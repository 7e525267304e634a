"""Models and where they run: policy folders (the user's checkpoint as Hugging Face saved it, the built-in
tiny model, its tokenizer, vision-language models), the view vLLM is given of a tied model, and placement —
the device, dtype and attention kernel of every workload, vLLM's device arguments and the memory plan.

May import: schema, artifacts.
"""
