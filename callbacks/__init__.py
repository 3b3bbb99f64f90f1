"""Keras callbacks for distributed training (`kerasdist.callbacks`)."""

from kerasdist.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
