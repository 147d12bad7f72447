"""Shapes of the lines a Python failure prints: traceback header, frames, chain markers, exception lines, usage
errors; each regex with the literals every line it matches holds, declared beside it.

One job: say what a line *is*; the extractor (extractor.py) decides what it means in context. Nothing here
knows a server by name. `LITERALS` is what the extractor's prefilter looks for: while no traceback is open, a
line holding none of them (nor a fatal marker's) is none of these shapes.
"""

from __future__ import annotations

import re

__all__ = ["LITERALS", "exception_line", "norm"]

TB_HEADER = "Traceback (most recent call last):"  # a literal itself, looked for anywhere in the body
TB_HEADER_LITERALS = (TB_HEADER,)

FRAME = re.compile(r'^\s*File "')
FRAME_LITERALS = ('File "',)

CHAIN = re.compile(
    r"^\s*(?:During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)\s*$"
)
CHAIN_LITERALS = ("During handling of the above exception", "The above exception was the direct cause")

# "Name: message" / "pkg.mod.Name: message" / "Name"
EXC_SHAPE = re.compile(r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?P<last>[A-Za-z_]\w*))(?::(?: (?P<msg>.*))?)?$")
# what the last part of a name must be for a line on its own to count as an exception line
STRONG_LAST = re.compile(
    r"^[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure)$|^(?:Exception|KeyboardInterrupt|StopIteration)$"
)
STRONG_LITERALS = ("Error", "Exception", "Exit", "Interrupt", "Fault", "Failure", "StopIteration")
# inside a traceback, after its frames, any name that sounds like an error will do
_ERRORISH = re.compile(r"(?:Error|Exception|Exit|Interrupt|Fault|Failure|Timeout|error|exception|timeout)$")
_NOT_EXC = frozenset({"None", "True", "False", "Note", "Example", "Usage", "Hint", "Warning"})

ARGPARSE = re.compile(r"^(?P<prog>[\w.\-/]+(?: [\w.\-]+){0,3}): error: (?P<msg>\S.*)$")
ARGPARSE_LITERALS = (": error: ",)
# A job launcher's notice, written into the task's own output, that it stopped the task: slurmstepd's
# "slurmstepd-node1: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-12-02T15:27:20 ***" once scancel or srun's
# --kill-on-bad-exit ended the step. It has the shape of a usage error, but it is the consequence of another
# node's failure (or of the teardown), never a cause. "... DUE TO TIME LIMIT ***" (or preemption, node failure)
# says why and stays a cause.
STOPPED_BY_LAUNCHER = re.compile(
    r"^slurmstepd(?:-[\w.\-]+)?: error: \*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ \*\*\*$")
# `python -m pkg.mod` without the package: "/venv/bin/python: Error while finding module specification for
# 'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')", or "python3: No module named vllm".
NO_MODULE = re.compile(r"^(?:\S*/)?python[\w.]*: (?:Error while finding module specification for .*\((?P<exc>"
                       r"ModuleNotFoundError: .*)\)|(?P<bare>No module named \S+))$")
NO_MODULE_LITERALS = ("No module named",)
# click/typer (transformers serve, sglang's newer CLIs): a usage error is "Error: <one of click's messages>".
CLICK_USAGE = re.compile(
    r"^Error: (?:No such (?:option|command)|Missing (?:argument|option|parameter)|Invalid value|"
    r"Got unexpected extra argument|Option '[^']+' requires)"
)
CLICK_USAGE_LITERALS = ("Error: ",)

# "Exception ignored in: <function ...>": the traceback that follows is printed and survived
EXCEPTION_IGNORED = re.compile(r"^\s*Exception ignored (?:in|on)\b")
EXCEPTION_IGNORED_LITERALS = ("Exception ignored ",)

# Lines that need no literal: they only matter inside an open traceback (or say that it is a consequence).
CARET = re.compile(r"^\s*[\^~]+\s*$")
REPEATED = re.compile(r"^\s*\[Previous line repeated \d+ more times?\]")
GROUP_BAR = re.compile(r"^\s*\| ?")  # exception groups draw their members' tracebacks behind "| "
CONSEQUENCE = re.compile(r"(?i)\b(?:see|check)\b[^.]{0,40}\babove\b")
TQDM = re.compile(r"\d+%\|| Completed \| \d+/\d+|\d+(?:\.\d+)?(?:it|s)/s\]")

# Every shape the extractor acts on while nothing is open (see RootCauseExtractor.idle).
LITERALS = (
    *TB_HEADER_LITERALS, *FRAME_LITERALS, *CHAIN_LITERALS, *STRONG_LITERALS, *ARGPARSE_LITERALS,
    *CLICK_USAGE_LITERALS, *EXCEPTION_IGNORED_LITERALS, *NO_MODULE_LITERALS,
)

_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def exception_line(body: str, *, strong: bool) -> str | None:
    """The body as an exception line ("KeyError: 'x'", "torch.OutOfMemoryError: ...", "KeyboardInterrupt").

    Loose (inside a traceback, after its frames): any dotted name whose last part is capitalised or sounds
    like an error. Strong (a line on its own): the last part must end in Error/Exception/Exit/Interrupt/...
    Indented lines are never exception lines (Python prints them at column 0).
    """
    if not body or body[0].isspace():
        return None
    text = body.rstrip()
    m = EXC_SHAPE.match(text)
    if not m:
        return None
    last = m.group("last")
    if last in _NOT_EXC:
        return None
    if strong:
        if not STRONG_LAST.match(last):
            return None
    elif not (last[0].isupper() or _ERRORISH.search(last) or ("." in m.group("name") and m.group("msg"))):
        return None
    return text


def norm(headline: str) -> str:
    """A headline with its numbers blanked: the same exception on every rank reads the same."""
    return " ".join(_NUMBERS.sub("#", headline).split())
