"""Planning a step: who runs, how many tokens, what is preempted; the plan as data."""
