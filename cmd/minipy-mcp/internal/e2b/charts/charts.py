# E2B's charts: beside a matplotlib figure's PNG, E2B's code interpreter gives its data as
# result.chart (the e2b/chart display), read out of the figure's artists: what kind of chart
# it is (line, scatter, bar, pie, box_and_whisker; superchart for a figure of several axes;
# unknown for anything else), its title, labels and the units written in them ("Time (s)"),
# its axes' scales and ticks, and its elements (series of points, bars, wedges, boxes).
# minipy-mcp -e2b runs this after startup.py in every worker, and registers _chart_format
# as the e2b/chart formatter, which minipy's notebook calls on each figure it shows
# (plt.show(), or a figure still open when a run ends) before the figure is closed.
#
# A chart is plain lists and dicts, JSON text for the display. Reading a figure must never
# cost the user their image: whatever goes wrong gives {} (as E2B's formatter answers a
# figure it cannot read, and one with no data), never an exception.
import bisect as _bisect
import json as _json
import math as _math
import numbers as _numbers
import re as _re
import sys as _sys
import warnings as _warnings

# A chart is for a client to draw again, not a copy of the figure's arrays; these caps keep
# a figure of ten million points from making a hundred megabytes of JSON (and the work).
_CHART_MAX_POINTS = 10_000  # points of one line or scatter series; a longer one is sampled evenly, its ends kept
_CHART_MAX_FIGURE_POINTS = 50_000  # points of all the series of a figure, shared equally among them
_CHART_MAX_ELEMENTS = 1_000  # series, bars, wedges or boxes of one chart; the rest are left out
_CHART_MAX_AXES = 64  # charts of a superchart (its first axes)
_CHART_MAX_TICKS = 1_000  # ticks of an axis
_CHART_MAX_OUTLIERS = 1_000  # outliers of a box
_CHART_MAX_ARTISTS = 100_000  # artists of an axes looked at to tell its kind; with more it is unknown
_CHART_MAX_JSON = 8 << 20  # a chart whose JSON is longer is given as {}, as one that could not be read

_CHART_UNIT = _re.compile(r"\s\(([^)]*)\)|\[([^\]]*)\]")  # "Time (s)", "Distance [km]"


def _chart_format(obj):
    """e2b/chart of a matplotlib Figure: its chart's JSON, or {} for a figure without data or
    one it cannot read; None for anything else (no chart)."""
    mod = _sys.modules.get("matplotlib.figure")  # (no Figure without matplotlib imported)
    if mod is None or not isinstance(obj, mod.Figure):
        return None
    try:
        with _warnings.catch_warnings():  # (the user's stderr is not for this reading's warnings)
            _warnings.simplefilter("ignore")
            chart = _chart_of_figure(obj)
        text = _json.dumps(chart, allow_nan=False) if chart else "{}"
    except Exception:  # noqa: BLE001 (a figure this cannot read still shows as its PNG)
        return "{}"
    return text if len(text) <= _CHART_MAX_JSON else "{}"


def _chart_of_figure(fig):
    """fig's chart as a dict, or None when no axes of it holds data."""
    axes = [ax for ax in fig.get_axes() if not _chart_is_colorbar(ax)]
    if not any(ax.has_data() for ax in axes):
        return None
    axes = axes[:_CHART_MAX_AXES]
    series = sum(len(ax.lines) + len(ax.collections) for ax in axes)
    per_series = max(2, min(_CHART_MAX_POINTS, _CHART_MAX_FIGURE_POINTS // max(1, series)))
    if len(axes) == 1:
        return _chart_of_axes(axes[0], per_series)
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else _chart_artist_text(getattr(fig, "_suptitle", None))
    return {"type": "superchart", "title": _chart_text(title),
            "elements": [_chart_of_axes(ax, per_series) for ax in axes]}


def _chart_is_colorbar(ax):
    """A colorbar's axes is part of the chart beside it, not a chart of its own."""
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def _chart_of_axes(ax, per_series):
    kind = _chart_kind(ax)
    chart = {"type": kind, "title": _chart_title(ax), "elements": []}
    if kind in ("unknown", "pie"):
        if kind == "pie":
            chart["elements"] = _chart_wedges(ax)
        return chart
    x_label, y_label = _chart_text(ax.get_xlabel()), _chart_text(ax.get_ylabel())
    if kind == "bar":
        horizontal, chart["elements"] = _chart_bars(ax)
    elif kind == "box_and_whisker":
        horizontal, chart["elements"] = _chart_boxes(ax)
    else:
        horizontal = False
    if horizontal:  # (x_label is the categories' axis's, y_label the values', as for upright ones)
        x_label, y_label = y_label, x_label
    chart.update(x_label=x_label, y_label=y_label, x_unit=_chart_unit(x_label), y_unit=_chart_unit(y_label))
    if kind in ("line", "scatter"):
        x, y = _chart_axis(ax.xaxis), _chart_axis(ax.yaxis)
        chart.update(x_ticks=x["ticks"], x_tick_labels=x["labels"], x_scale=x["scale"],
                     y_ticks=y["ticks"], y_tick_labels=y["labels"], y_scale=y["scale"])
        points = _chart_lines if kind == "line" else _chart_scatters
        chart["elements"] = points(ax, per_series, x, y)
    return chart


# ---------------------------------------------------------------------------------------
# What kind of chart an axes is: decided by its artists, texts aside. Only lines: a line
# chart, unless they draw boxes (boxplot's default). Only patches made of paths and lines:
# boxes and whiskers (boxplot's patch_artist). Otherwise, lines that are a horizontal or
# vertical segment (axhline, a mean marked by hand) do not count, and only marker
# collections make a scatter chart, only wedges a pie, only rectangles bars.
# ---------------------------------------------------------------------------------------


def _chart_kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)  # (matplotlib >= 3.5: every artist, in order)
    if children is None:
        children = [*ax.lines, *ax.patches, *ax.collections, *ax.images, *ax.artists, *ax.tables]
    if len(children) > _CHART_MAX_ARTISTS:
        return "unknown"
    artists = [a for a in children if not isinstance(a, Text)]
    if all(isinstance(a, Line2D) for a in artists):
        return "box_and_whisker" if _chart_line_boxes(artists) else "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    artists = [a for a in artists if not (isinstance(a, Line2D) and _chart_segment(a) is not None)]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(a, cls) for a in artists):
            return kind
    return "unknown"


def _chart_segment(line):
    """A line of two points that is horizontal or vertical: its (x0, y0, x1, y1), else None."""
    xy = _chart_xy(line, 2)
    if xy is None:
        return None
    (x0, y0), (x1, y1) = xy
    return (x0, y0, x1, y1) if x0 == x1 or y0 == y1 else None


def _chart_xy(line, n):
    """line's points as [(x, y)] floats in data units if it has n, else None."""
    try:
        xy = line.get_xydata()
        return [(float(x), float(y)) for x, y in xy] if len(xy) == n else None
    except (TypeError, ValueError):
        return None


def _chart_rectangle(line):
    """A line drawn as a closed axis-aligned rectangle (boxplot's box without patch_artist):
    its (x0, x1, y0, y1), else None."""
    xy = _chart_xy(line, 5)
    if xy is None or xy[0] != xy[4]:
        return None
    xs, ys = {x for x, _ in xy}, {y for _, y in xy}
    if len(xs) != 2 or len(ys) != 2:
        return None
    for (xa, ya), (xb, yb) in zip(xy, xy[1:]):
        if xa != xb and ya != yb:
            return None
    return (min(xs), max(xs), min(ys), max(ys))


def _chart_marks_only(line):
    ls = line.get_linestyle()
    return ls in ("None", "none", "", " ") and line.get_marker() not in (None, "None", "none", "", " ")


def _chart_line_boxes(lines):
    """Whether lines alone are a boxplot drawn without patch_artist: boxes as rectangles, and
    else only whiskers, caps and medians (segments) and fliers or means (marks)."""
    boxes = 0
    for line in lines:
        if _chart_rectangle(line) is not None:
            boxes += 1
        elif _chart_segment(line) is None and not _chart_marks_only(line):
            return False
    return boxes > 0


# ---------------------------------------------------------------------------------------
# Texts and axes: a title, labels, units, ticks and scales.
# ---------------------------------------------------------------------------------------


def _chart_text(s):
    return str(s) if s else None


def _chart_artist_text(artist):
    return artist.get_text() if artist is not None else None


def _chart_title(ax):
    """The axes' title: the centred one, else the left's, else the right's."""
    for loc in ("center", "left", "right"):
        title = ax.get_title(loc)
        if title:
            return str(title)
    return None


def _chart_unit(label):
    """The unit a label gives in parentheses after a space or in brackets: "Time (s)" is s."""
    if not label:
        return None
    m = _CHART_UNIT.search(label)
    if m is None:
        return None
    return m.group(1) or m.group(2) or None


def _chart_converter(axis):
    get = getattr(axis, "get_converter", None)  # (matplotlib >= 3.10; an attribute before)
    return get() if callable(get) else getattr(axis, "converter", None)


def _chart_axis_kind(axis):
    """("datetime", None), ("categorical", {index: category}) or (None, None) for axis."""
    import matplotlib.category as mcategory
    import matplotlib.dates as mdates

    conv = _chart_converter(axis)
    if conv is not None and (isinstance(conv, mdates.DateConverter) or type(conv).__module__ == mdates.__name__):
        return "datetime", None
    if isinstance(axis.get_major_locator(), mdates.DateLocator):
        return "datetime", None
    if isinstance(conv, mcategory.StrCategoryConverter):
        mapping = getattr(axis.units, "_mapping", None) or {}
        return "categorical", {int(v): str(k) for k, v in mapping.items()}
    return None, None


def _chart_date(num):
    """A matplotlib date number in ISO form (with its time zone, UTC)."""
    import matplotlib.dates as mdates

    try:
        return mdates.num2date(num).isoformat()
    except (ValueError, OverflowError, TypeError):
        return _chart_float(num)


def _chart_axis(axis):
    """axis's ticks (ISO dates on a date axis, else numbers), their labels and its scale."""
    kind, categories = _chart_axis_kind(axis)
    locs = [float(t) for t in list(axis.get_majorticklocs())[:_CHART_MAX_TICKS]]
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
    except Exception:  # noqa: BLE001 (a formatter of the user's own that fails: no labels)
        labels = [""] * len(locs)
    if kind == "datetime":
        ticks, scale = [_chart_date(t) for t in locs], "datetime"
    else:
        ticks, scale = [_chart_round(t) for t in locs], axis.get_scale()  # (0.30000000000000004 is 0.3)
        if scale == "linear" and (kind == "categorical" or _chart_counted(locs, labels)):
            scale = "categorical"
    return {"ticks": ticks, "labels": labels, "scale": scale, "kind": kind, "categories": categories,
            "locs": locs}


def _chart_counted(locs, labels):
    """Ticks at 0, 1, 2, ... labelled with words rather than those numbers: categories."""
    if not locs or len(labels) != len(locs):
        return False
    for i, (loc, label) in enumerate(zip(locs, labels)):
        if loc != i:
            return False
        try:
            if float(label.replace("\u2212", "-")) == i:
                return False
        except ValueError:
            pass
    return True


def _chart_labeler(axis):
    """label(centre, half): what a bar or box centred at centre (half as wide) on axis is
    called: its category, its date, or where the ticks were placed by hand (set_xticks(x,
    names), boxplot's) the label of the tick nearest it (nearer than half the ticks'
    spacing, or within it with one tick: grouped bars stand around theirs), else its
    position as a number (a histogram's bar is not its nearest automatic tick's)."""
    import matplotlib.ticker as mticker

    info = _chart_axis(axis)
    if info["kind"] == "categorical" and info["categories"]:
        cats = info["categories"]
        return lambda c, half: cats.get(int(round(c)), _chart_number_text(c))
    if info["kind"] == "datetime":
        return lambda c, half: _chart_date(c)
    if not isinstance(axis.get_major_locator(), mticker.FixedLocator):
        return lambda c, half: _chart_number_text(c)
    pairs = sorted((loc, text) for loc, text in zip(info["locs"], info["labels"]) if _math.isfinite(loc))
    locs = [loc for loc, _ in pairs]
    gaps = [b - a for a, b in zip(locs, locs[1:]) if b > a]
    spacing = min(gaps) if gaps else None

    def label(c, half):
        if locs:
            i = _bisect.bisect_left(locs, c)
            j = min((j for j in (i - 1, i) if 0 <= j < len(locs)), key=lambda j: abs(locs[j] - c))
            near, text = abs(locs[j] - c), pairs[j][1]
            if text and (near < spacing / 2 if spacing is not None else near <= abs(half)):
                return text
        return _chart_number_text(c)

    return label


# ---------------------------------------------------------------------------------------
# Values: what a point, a bar or a box holds, as JSON has it.
# ---------------------------------------------------------------------------------------


def _chart_float(v):
    """v as a float, None when it is none or not finite (JSON has no NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if _math.isfinite(f) else None


def _chart_round(v):
    """v without float noise (324.00000000000006 is 324.0): ten significant digits."""
    f = _chart_float(v)
    return None if f is None else float("%.10g" % f)


def _chart_number_text(v):
    f = _chart_float(v)
    return "" if f is None else "%.10g" % f


def _chart_value(v):
    """A point's coordinate as JSON has it: a number, text (a category), a date in ISO form."""
    if v is None:
        return None
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (int, float)):
        return _chart_float(v)
    np = _sys.modules.get("numpy")
    if np is not None:
        if v is np.ma.masked:
            return None
        if isinstance(v, np.datetime64):
            if np.isnat(v):
                return None
            d = v.astype("datetime64[us]").item()  # (a datetime; an int out of its range)
            return d.isoformat() if hasattr(d, "isoformat") else str(v)
        if isinstance(v, np.bool_):
            return float(v)
    if isinstance(v, _numbers.Number):  # numpy's, Decimal, Fraction
        return _chart_float(v)
    iso = getattr(v, "isoformat", None)  # datetime, date, time, pandas' Timestamp
    if callable(iso):
        return None if v != v else iso()  # (pandas' NaT is not itself)
    return str(v)


def _chart_sample(n, k):
    """Indices of at most k of n items, evenly spread, the first and the last among them."""
    if n <= k:
        return range(n)
    if k < 2:
        return range(min(n, k))
    return [(i * (n - 1) + (k - 1) // 2) // (k - 1) for i in range(k)]


def _chart_pick(data, idx):
    """data's values at idx, as JSON values."""
    np = _sys.modules.get("numpy")
    if np is not None and not isinstance(data, (np.ndarray, list, tuple)):
        data = np.asarray(data)  # (a pandas Series would index by label)
    if np is not None and isinstance(data, np.ndarray) and data.dtype.kind in "biuf":
        picked = np.asarray(data[list(idx)] if not isinstance(idx, range) else data[idx.start:idx.stop])
        picked = np.ma.filled(np.ma.asarray(picked).astype(float), np.nan)
        return [f if _math.isfinite(f) else None for f in picked.tolist()]
    return [_chart_value(data[i]) for i in idx]


def _chart_series_label(label, prefix, number):
    """A series' label; one matplotlib made up (hidden: "_child3") is prefix and its number."""
    label = str(label)
    if not label.startswith("_"):
        return label
    digits = _re.search(r"(\d+)$", label)
    return "%s %s" % (prefix, digits.group(1) if digits else number)


# ---------------------------------------------------------------------------------------
# Elements of each kind of chart.
# ---------------------------------------------------------------------------------------


def _chart_lines(ax, per_series, x, y):
    """A line chart's series: {label, points: [[x, y]]}, x and y as the data had them (dates
    in ISO form, categories as text). Lines across the whole axes (axhline, axvline) are
    not series."""
    out = []
    for i, line in enumerate(ax.get_lines()):
        if len(out) >= _CHART_MAX_ELEMENTS:
            break
        if line.get_transform() is not ax.transData and _chart_segment(line) is not None:
            continue
        xs, ys = line.get_xdata(), line.get_ydata()
        xs = xs if hasattr(xs, "__len__") else [xs]
        ys = ys if hasattr(ys, "__len__") else [ys]
        idx = _chart_sample(min(len(xs), len(ys)), per_series)
        out.append({"label": _chart_series_label(line.get_label(), "Line", i),
                    "points": [list(p) for p in zip(_chart_pick(xs, idx), _chart_pick(ys, idx))]})
    return out


def _chart_scatters(ax, per_series, x, y):
    """A scatter chart's series: {label, points}, a date axis's values in ISO form, a
    categorical one's as their categories."""

    def axis_values(info, column):
        if info["kind"] == "datetime":
            return [None if v is None else _chart_date(v) for v in column]
        if info["kind"] == "categorical" and info["categories"]:
            cats = info["categories"]
            return [None if v is None else cats.get(int(round(v)), v) for v in column]
        return column

    import numpy as np  # (matplotlib's own)

    out = []
    for i, coll in enumerate(ax.collections):
        if len(out) >= _CHART_MAX_ELEMENTS:
            break
        offsets = np.ma.asarray(coll.get_offsets())
        if offsets.ndim != 2 or offsets.shape[1] != 2:
            continue
        idx = _chart_sample(len(offsets), per_series)
        xs, ys = _chart_pick(offsets[:, 0], idx), _chart_pick(offsets[:, 1], idx)
        points = zip(axis_values(x, xs), axis_values(y, ys))
        out.append({"label": _chart_series_label(coll.get_label(), "Scatter", i), "points": [list(p) for p in points]})
    return out


def _chart_wedges(ax):
    """A pie's wedges: {label, angle (degrees), radius}."""
    from matplotlib.patches import Wedge

    out = []
    for wedge in ax.patches:
        if len(out) >= _CHART_MAX_ELEMENTS:
            break
        if isinstance(wedge, Wedge):
            # (pie reckons its wedges in float32: 323.9999914 is 324, to a thousandth of a degree)
            angle = round(abs(float(wedge.theta2) - float(wedge.theta1)), 3)
            out.append({"label": str(wedge.get_label()), "angle": angle, "radius": _chart_round(wedge.r)})
    return out


def _chart_bars(ax):
    """Bars: (horizontal, [{label, group, value}]), a group for each bar call (its label, or
    "Group N"), each bar labelled by the category or tick where it stands, its value its
    height (its width lying down; a stacked bar's own part)."""
    from matplotlib.container import BarContainer

    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    horizontal = bool(containers) and _chart_bars_horizontal(containers[0])
    label = _chart_labeler(ax.yaxis if horizontal else ax.xaxis)
    out = []
    for n, container in enumerate(containers):
        group = _chart_series_label(container.get_label(), "Group", n)
        data = getattr(container, "datavalues", None)
        bars = list(container.patches)
        if data is None or len(data) != len(bars):
            data = [bar.get_width() if horizontal else bar.get_height() for bar in bars]
        for bar, value in zip(bars, data):
            if len(out) >= _CHART_MAX_ELEMENTS:
                return horizontal, out
            if horizontal:
                centre, half = bar.get_y() + bar.get_height() / 2, bar.get_height() / 2
            else:
                centre, half = bar.get_x() + bar.get_width() / 2, bar.get_width() / 2
            out.append({"label": label(centre, half), "group": group, "value": _chart_float(value)})
    return horizontal, out


def _chart_bars_horizontal(container):
    orientation = getattr(container, "orientation", None)  # (matplotlib >= 3.4 says)
    if orientation in ("horizontal", "vertical"):
        return orientation == "horizontal"
    heights = {bar.get_height() for bar in container.patches}
    widths = {bar.get_width() for bar in container.patches}
    return len(heights) == 1 and len(widths) > 1


def _chart_close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _chart_boxes(ax):
    """Boxes and whiskers: (horizontal, [{label, min, first_quartile, median, third_quartile,
    max, outliers}]). Read from the drawing: a box spans the quartiles, the median is the
    line across it, the whiskers the lines from its ends to min and max, the outliers the
    marks beyond them. A box with two lines of marks has its mean's first (boxplot draws a
    box's mean before its fliers), which is not an outlier."""
    rects, segments, marks = _chart_box_drawing(ax)

    # Upright boxes have medians across them left to right (y constant, x over the box's
    # width); lying ones top to bottom. The way more medians fit is the boxes' way.
    def flipped(r):
        return (r[2], r[3], r[0], r[1])

    upright = _chart_medians_found(rects, segments) >= _chart_medians_found(
        [flipped(r) for r in rects], [(s[1], s[0], s[3], s[2]) for s in segments])
    if not upright:
        rects = [flipped(r) for r in rects]
        segments = [(s[1], s[0], s[3], s[2]) for s in segments]
        marks = [[(y, x) for x, y in points] for points in marks]
    label = _chart_labeler(ax.xaxis if upright else ax.yaxis)
    found = _chart_box_parts(rects, segments, marks)
    out = []
    for (b0, b1, q1, q3), box in zip(rects, found):
        out.append({"label": label((b0 + b1) / 2, (b1 - b0) / 2),
                    "min": _chart_round(box["min"] if box["min"] is not None else q1),
                    "first_quartile": _chart_round(q1),
                    "median": _chart_round(box["median"]),
                    "third_quartile": _chart_round(q3),
                    "max": _chart_round(box["max"] if box["max"] is not None else q3),
                    "outliers": box["outliers"]})
    return not upright, out


def _chart_box_drawing(ax):
    """A box plot's drawing: its boxes' rectangles (p0, p1, v0, v1), its straight segments
    (p0, v0, p1, v1), and each line of marks' points."""
    from matplotlib.patches import PathPatch

    boxes_drawn = [p for p in ax.patches if isinstance(p, PathPatch)][:_CHART_MAX_ELEMENTS]
    rects, lines = [], []
    for patch in boxes_drawn:  # (patch_artist=True: boxes are patches)
        v = patch.get_path().vertices
        if len(v):
            rects.append((float(v[:, 0].min()), float(v[:, 0].max()), float(v[:, 1].min()), float(v[:, 1].max())))
    for line in ax.get_lines():  # (else lines drawn as rectangles)
        r = None if boxes_drawn or len(rects) >= _CHART_MAX_ELEMENTS else _chart_rectangle(line)
        if r is not None:
            rects.append(r)
        else:
            lines.append(line)
    segments = [s for s in (_chart_segment(line) for line in lines) if s is not None]
    marks = []  # each line of marks' points
    for line in lines:
        if _chart_marks_only(line):
            marks.append([(float(x), float(y)) for x, y in line.get_xydata()[:_CHART_MAX_OUTLIERS]])
    return rects, segments, marks


def _chart_box_parts(rects, segments, marks):
    """Each upright box's median, whiskers' ends (min, max) and outliers, from its
    segments and marks."""
    order = sorted(range(len(rects)), key=lambda i: rects[i][0])
    starts = [rects[i][0] for i in order]

    def box_at(p):
        """The box whose position span holds p (an index into rects), or None."""
        slack = 1e-9 * max(1.0, abs(p))
        j = _bisect.bisect_right(starts, p + slack) - 1
        for k in range(j, max(-1, j - 8), -1):  # (boxes seldom overlap: the nearest few)
            r = rects[order[k]]
            if r[0] - slack <= p <= r[1] + slack:
                return order[k]
        return None

    found = [{"median": None, "min": None, "max": None, "outliers": []} for _ in rects]
    for p0, v0, p1, v1 in segments:
        i = box_at((p0 + p1) / 2)
        if i is None:
            continue
        b0, b1, q1, q3 = rects[i]
        box = found[i]
        if v0 == v1:  # across: the median if it spans the box between its quartiles
            if (box["median"] is None and _chart_close(min(p0, p1), b0) and _chart_close(max(p0, p1), b1)
                    and q1 - 1e-9 * max(1.0, abs(q1)) <= v0 <= q3 + 1e-9 * max(1.0, abs(q3))):
                box["median"] = v0
        elif p0 == p1:  # along: a whisker from an end of the box
            lo, hi = min(v0, v1), max(v0, v1)
            if _chart_close(hi, q1) and box["min"] is None:
                box["min"] = lo
            elif _chart_close(lo, q3) and box["max"] is None:
                box["max"] = hi
    marked = {}  # box: its lines of marks
    for points in marks:
        i = box_at(points[0][0]) if points else None
        if i is not None:
            marked.setdefault(i, []).append(points)
    for i, lines_of_marks in marked.items():
        if len(lines_of_marks) > 1 and len(lines_of_marks[0]) == 1:
            lines_of_marks = lines_of_marks[1:]  # (its mean)
        box, (_, _, q1, q3) = found[i], rects[i]
        lo = box["min"] if box["min"] is not None else q1
        hi = box["max"] if box["max"] is not None else q3
        for points in lines_of_marks:
            for p, v in points:
                if (v < lo or v > hi) and len(box["outliers"]) < _CHART_MAX_OUTLIERS:
                    box["outliers"].append(_chart_round(v))
    return found


def _chart_medians_found(rects, segments):
    """How many of rects (p0, p1, v0, v1) have a segment across them, v constant, from p0 to p1."""
    spans = {}
    for p0, v0, p1, v1 in segments:
        if v0 == v1:
            spans.setdefault((_chart_round(min(p0, p1)), _chart_round(max(p0, p1))), []).append(v0)
    found = 0
    for p0, p1, v0, v1 in rects:
        vs = spans.get((_chart_round(p0), _chart_round(p1)), ())
        if any(v0 <= v <= v1 for v in vs):
            found += 1
    return found


__minipy__.display_formatter.formatters["e2b/chart"] = _chart_format  # noqa: F821  (minipy's builtin)
