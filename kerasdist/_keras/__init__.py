"""kerasdist's Keras layer (private): the distributed optimizer and
gradient tape, gradient reduction, the first-update broadcast, `fit()`'s
guard, synchronized batch normalization, learning-rate schedules and the
elastic state's callbacks. The public modules (`kerasdist`,
`kerasdist.keras`, `kerasdist.callbacks`, `kerasdist.elastic`) export it.
"""
