"""Training (§5): the recipe's checks, a run set up, each step's batches, the loss and one
optimizer step, the schedules and their fit to a time budget, validation, the run's state,
the loop, the end of a run (averaging, the length penalty chosen on validation), and its
training curves drawn from the metrics log.
"""
