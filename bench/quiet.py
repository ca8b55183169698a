"""Known, harmless library chatter that would otherwise repeat in every log (once per rank)."""
from __future__ import annotations

import logging
import warnings

QUIET_LOGGERS = ("torchrec", "torch.fx._symbolic_trace")
# torchrec.distributed.logger makes loggers named "<destination>-<handler class>" outside the torchrec
# namespace; MethodLogger records every planner call (inputs and outputs) at INFO
TORCHREC_LOGGER_DESTINATIONS = ("MethodLogger", "UnfilteredLogger", "SingleRankStaticLogger",
                                "AllRankStaticLogger", "CappedLogger", "Cap1Logger", "Cap01Logger")


def quiet_libraries() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):  # those torchrec created already (at its import)
        if name.split("-")[0] in TORCHREC_LOGGER_DESTINATIONS:
            logging.getLogger(name).setLevel(logging.ERROR)
    # Messages logged through the root logger itself (torchrec: once per data-parallel table) or that
    # reach its handlers from module loggers (fbgemm: one line per library it loads at import).
    root = logging.getLogger()
    root.addFilter(_drop_noise)
    for handler in root.handlers:
        handler.addFilter(_drop_noise)


NOISE_PREFIXES = ("Sharding spec not found", "Successfully loaded")


def _drop_noise(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(NOISE_PREFIXES)
