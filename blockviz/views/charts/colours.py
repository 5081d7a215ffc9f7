"""The charts' colours, and the rule they keep: readable on a light and on a dark page.

The dashboard follows the browser's light or dark setting, and Streamlit draws a chart on
the page's own background (white, or #171614 in its dark theme); an exported PNG or SVG
keeps Vega's white. So every colour a chart draws lines, points, rules or text in has a
WCAG 2 contrast ratio of at least MIN_CONTRAST (3:1, the level WCAG asks of graphics and
large text) against both backgrounds: a relative luminance between about 0.12 and 0.30.
Heat-map cells (filled areas read against their colour legend, not against the page)
keep their sequential schemes.
"""

from __future__ import annotations

import colorsys

LIGHT_BACKGROUND = "#ffffff"  # Streamlit's light theme, and every export
DARK_BACKGROUND = "#171614"  # Streamlit 1.67's dark theme, as chromium draws the page
BACKGROUNDS = (LIGHT_BACKGROUND, DARK_BACKGROUND)
MIN_CONTRAST = 3.0

# Vega's "tableau10" hues, reordered so that runs with neighbouring ids never get
# neighbouring hues, and the five too pale for a white page (orange, teal, pink, yellow,
# grey: 1.6 to 2.6:1) darkened in their own hue until they pass on white (>= 3.3:1, all of
# them >= 5:1 on the dark page). Pink became tableau's magenta, darkened: a darker pink
# read as a second red. A run's colour is PALETTE[run_id % 10], whatever else is drawn.
PALETTE = (
    "#4c78a8",  # blue
    "#d86f09",  # orange
    "#54a24b",  # green
    "#e45756",  # red
    "#b279a2",  # purple
    "#4e9993",  # teal
    "#9d755d",  # brown
    "#dd5cb6",  # magenta
    "#a8890f",  # mustard (tableau's yellow)
    "#988a84",  # grey
)
NEUTRAL = "#808080"  # guides, notes, the dash legend's strokes: 3.9:1 on white, 4.6:1 on dark


def _channels(colour: str) -> tuple[float, float, float]:
    """'#rrggbb' as three floats in [0, 1] (nothing else is accepted)."""
    if len(colour) != 7 or colour[0] != "#":
        raise ValueError(f"colour: {colour!r} is not allowed; must be '#rrggbb'")
    red, green, blue = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return red, green, blue


def _hex(red: float, green: float, blue: float) -> str:
    return "#" + "".join(f"{round(min(1.0, max(0.0, c)) * 255):02x}" for c in (red, green, blue))


def relative_luminance(colour: str) -> float:
    """WCAG 2's relative luminance of an sRGB colour '#rrggbb' (0 black .. 1 white)."""
    linear = [
        c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in _channels(colour)
    ]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(colour: str, background: str) -> float:
    """WCAG 2's contrast ratio of two colours, 1 (none) .. 21 (black on white)."""
    high, low = sorted((relative_luminance(colour), relative_luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def readable(colour: str) -> bool:
    """Whether `colour` has MIN_CONTRAST against both backgrounds."""
    return all(contrast_ratio(colour, bg) >= MIN_CONTRAST for bg in BACKGROUNDS)


def _with_lightness(colour: str, lightness: float) -> str:
    hue, _, saturation = colorsys.rgb_to_hls(*_channels(colour))
    return _hex(*colorsys.hls_to_rgb(hue, lightness, saturation))


def shade(colour: str, position: float) -> str:
    """`colour` made lighter (`position` < 0) or darker (> 0) in its own hue, -1 and 1
    being the lightest and darkest versions that are still `readable`."""
    _, lightness, _ = colorsys.rgb_to_hls(*_channels(colour))
    if position == 0:
        return colour
    # The readable lightnesses of a hue form one interval around a readable colour's
    # own; bisect for its end on the side asked for.
    inside, outside = lightness, (1.0 if position < 0 else 0.0)
    for _ in range(30):
        middle = (inside + outside) / 2
        inside, outside = (
            (middle, outside) if readable(_with_lightness(colour, middle)) else (inside, middle)
        )
    return _with_lightness(colour, lightness + (inside - lightness) * min(1.0, abs(position)))


def depth_colours(count: int) -> list[str]:
    """`count` colours in depth order, from blue (the first layer) through purple and red
    to orange (the last): the hue turns while the luminance stays where both backgrounds
    read it (a sequential scheme such as viridis runs from near black to near white, and
    its ends vanish on one page or the other)."""
    if count < 1:
        return []
    first, last = 215.0, 390.0  # hue in degrees: blue, through magenta, to orange (30)
    hues = [first + (last - first) * i / max(1, count - 1) for i in range(count)]
    target = 0.19  # relative luminance, about the middle of the readable band
    colours = []
    for hue in hues:
        low, high = 0.0, 1.0  # HLS lightness, bisected to the target luminance
        for _ in range(30):
            middle = (low + high) / 2
            candidate = _hex(*colorsys.hls_to_rgb((hue % 360) / 360, middle, 0.65))
            low, high = (middle, high) if relative_luminance(candidate) < target else (low, middle)
        colours.append(_hex(*colorsys.hls_to_rgb((hue % 360) / 360, low, 0.65)))
    return colours
