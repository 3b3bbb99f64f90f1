"""Keras callbacks for distributed training (`kerasdist.callbacks`)."""

from kerasdist.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from kerasdist.callbacks.backup_and_restore import BackupAndRestore
from kerasdist.callbacks.best_model_checkpoint import BestModelCheckpoint
from kerasdist.callbacks.model_checkpoint import ModelCheckpoint
from kerasdist.callbacks.lr_schedule import LearningRateScheduleCallback
from kerasdist.callbacks.lr_warmup import LearningRateWarmupCallback
from kerasdist.callbacks.metric_average import MetricAverageCallback
from kerasdist.callbacks.stop_sync import SyncStopTrainingCallback
from kerasdist.callbacks.uneven_data import UnevenDataCallback
