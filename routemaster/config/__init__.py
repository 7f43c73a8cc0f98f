"""The configuration: YAML in, an immutable, validated :class:`Config` out.

``load_config`` reads and layers the files, checks the shape (JSON Schema) and
the meaning (names, graph, conditions, formats), and reports every problem at
once as a :class:`ConfigError`.
"""

from routemaster.config.graph import describe_machine
from routemaster.config.loader import load_config
from routemaster.config.model import (
    Action,
    ApiConfig,
    Config,
    ConstantNext,
    ContextNext,
    ContextNextDestination,
    EntryTrigger,
    Feed,
    Gate,
    IntervalTrigger,
    LoggingPlugin,
    MetadataTimezone,
    MetadataTrigger,
    Migration,
    NamedTimezone,
    NextStates,
    NoNext,
    RetryPolicy,
    State,
    StateMachine,
    SystemTimezone,
    TimerTrigger,
    TimeTrigger,
    Timezone,
    Trigger,
    WebhookHeaderRule,
)
from routemaster.config.problems import ConfigError, ConfigProblem
from routemaster.config.validation import config_warnings

__all__ = [
    "Action",
    "ApiConfig",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "ConstantNext",
    "ContextNext",
    "ContextNextDestination",
    "EntryTrigger",
    "Feed",
    "Gate",
    "IntervalTrigger",
    "LoggingPlugin",
    "MetadataTimezone",
    "MetadataTrigger",
    "Migration",
    "NamedTimezone",
    "NextStates",
    "NoNext",
    "RetryPolicy",
    "State",
    "StateMachine",
    "SystemTimezone",
    "TimeTrigger",
    "TimerTrigger",
    "Timezone",
    "Trigger",
    "WebhookHeaderRule",
    "config_warnings",
    "describe_machine",
    "load_config",
]
