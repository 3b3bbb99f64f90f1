"""Keras callbacks for distributed training (`kerasdist.callbacks`)."""

from kerasdist.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from kerasdist.callbacks.backup_and_restore import BackupAndRestore
from kerasdist.callbacks.model_checkpoint import ModelCheckpoint
