"""One palette and one size unit for every view: the dashboard, the HTML report and the
TensorBoard export import their colours from here (views never from the dashboard).

Colours are Okabe & Ito's colour-blind-safe set (Color Universal Design, 2002): eight hues that
stay distinct under protanopia, deuteranopia and tritanopia. Phases are blues (forward light,
backward dark) and yellow (optimizer); each collective op has its own hue; vermillion is kept for
one meaning only, exposed communication (time nobody computes while the collective runs).
"""
from __future__ import annotations

from plotly.colors import hex_to_rgb

BLACK, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
GREY = "#999999"
LIGHT_GREY = "#d9d9d9"

PHASE = {"forward": SKY, "backward": BLUE, "optimizer": YELLOW, "other": LIGHT_GREY}
OP = {"all_reduce": GREEN, "reduce_scatter": PURPLE, "all_gather": ORANGE, "broadcast": GREY,
      "reduce": GREY, "all_to_all": GREY, "barrier": BLACK, "send": GREY, "recv": GREY}
EXPOSED = VERMILLION
EXPOSED_TINT = "rgba({},{},{},0.3)".format(*hex_to_rgb(EXPOSED))   # exposed comm where it cannot be hatched (timeline paths)
READY = BLACK
# Split of a step's time (Ratios, Distributed, Strategies): the same meaning, the same colour.
SPLIT = {"compute only": BLUE, "overlapped comm": GREEN, "exposed comm": EXPOSED,
         "waiting for peers": ORANGE, "other (idle, data, host)": LIGHT_GREY}
# Memory per rank (Strategies): parameters, gradients, optimizer state, parameters gathered.
MEMORY = {"parameters": BLUE, "gradients": SKY, "optimizer state": YELLOW,
          "parameters held after forward": PURPLE}
# Colour names, for views that cannot draw a colour (TensorBoard colours lines by run, not by tag).
NAME = {BLACK: "black", ORANGE: "orange", SKY: "sky blue", GREEN: "bluish green", YELLOW: "yellow", BLUE: "blue",
        VERMILLION: "vermillion", PURPLE: "reddish purple", GREY: "grey", LIGHT_GREY: "light grey"}
# Continuous scales: bucket index (colour-blind safe, no red) and lateness (one hue, light → dark).
BUCKET_SCALE = "Viridis"
HEAT_SCALE = "Oranges"

# One size unit everywhere: MB = 10^6 bytes, as nccl-tests counts (torch's bucket_cap_mb is in MiB:
# where a cap is shown, it is converted).
MB = 1e6
SIZE_UNIT = "MB"


def op_color(op: str) -> str:
    return OP.get(str(op), GREY)


def fmt_mb(nbytes: float, digits: int = 2) -> str:
    return f"{nbytes / MB:.{digits}f} {SIZE_UNIT}"
