"""Training (§5): the loss and one optimizer step, the schedules and their fit to a time
budget, validation, the run's state, the loop, and the end of a run (averaging, the length
penalty chosen on validation).
"""
