"""Ids of the platform's own objects, in OpenAI's form (`resp_…`, `evt_…`)."""

import os
import time


def new_id(prefix: str) -> str:
    # time first: ids sort in creation order, as OpenAI's do
    return f"{prefix}_{time.time_ns():x}{os.urandom(8).hex()}"
