# E2B's code interpreter shows results as its startup scripts make them: a DataFrame's data
# (e2b/data, its columns as lists), list and dict values as JSON, and an image that PIL's
# Image.save writes to a file displayed too. minipy-mcp -e2b runs this once in each worker as
# it starts (IsolatedConfig.Startup: in the template, which every sandbox is forked from),
# through minipy's display formatters (__minipy__.display_formatter, IPython's names).
import json as _json
import os as _os
import sys as _sys

_MAX_JSON = 1 << 20  # a value whose JSON is longer keeps its text alone
_MAX_CELLS = 100_000  # a DataFrame with more cells has no data (to_dict would copy it whole)


def _plain(v):
    """What json cannot write as it is: numpy's scalars and arrays, dates and times."""
    for method in ("tolist", "isoformat"):
        fn = getattr(v, method, None)
        if callable(fn):
            return fn()
    raise TypeError("%s is not JSON" % type(v).__name__)


def _json_text(v):
    try:
        text = _json.dumps(v, default=_plain, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return text if len(text) <= _MAX_JSON else None


def _json_format(obj):
    """application/json of a list or a dict (E2B's JSON formatter)."""
    return _json_text(obj) if isinstance(obj, (list, dict)) else None


def _data_format(obj):
    """e2b/data of a DataFrame: {column: [values]}, timestamps in ISO form, NaN and NaT as null."""
    pandas = _sys.modules.get("pandas")  # (no DataFrame without pandas imported)
    if pandas is None or not isinstance(obj, pandas.DataFrame) or obj.size > _MAX_CELLS:
        return None

    def cell(x):
        if x is pandas.NaT:
            return None
        if isinstance(x, pandas.Timestamp):
            return x.isoformat()
        return None if isinstance(x, float) and x != x else x

    return _json_text({str(k): [cell(x) for x in column] for k, column in obj.to_dict(orient="list").items()})


def _display_saved_images():
    try:
        from PIL import Image
    except ImportError:
        return  # (no PIL here)
    save = Image.Image.save

    def saved(self, fp, format=None, **params):
        if isinstance(fp, (str, _os.PathLike)):
            display(self)  # noqa: F821  (minipy's builtin)
        return save(self, fp, format, **params)

    saved.__doc__, saved.__wrapped__ = save.__doc__, save
    Image.Image.save = saved


__minipy__.display_formatter.formatters.update({"application/json": _json_format, "e2b/data": _data_format})  # noqa: F821
_display_saved_images()
