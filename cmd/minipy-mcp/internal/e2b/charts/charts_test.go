package charts

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// python is the interpreter the tests read figures in: the system's, to which .ci/deps
// gives matplotlib and numpy (python3-matplotlib, python3-numpy).
const python = "/usr/bin/python3"

// harness runs charts.py (argv[1]) with a stand-in for minipy's __minipy__, then the
// figures script (argv[2]), and writes what the registered e2b/chart formatter gives each
// figure left open (in figure-number order) and a few values that are not figures.
const harness = `
import builtins, json, sys, types
builtins.__minipy__ = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={}))
with open(sys.argv[1]) as f:
    exec(compile(f.read(), "charts.py", "exec"), {"__name__": "charts"})
fmt = builtins.__minipy__.display_formatter.formatters["e2b/chart"]
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
with open(sys.argv[2]) as f:
    exec(compile(f.read(), "figures.py", "exec"), {"__name__": "__main__"})
json.dump({"charts": [fmt(plt.figure(n)) for n in plt.get_fignums()],
           "others": [fmt(v) for v in (1, "text", [1, 2], {"a": 1}, None)]}, sys.stdout)
`

var havePython = sync.OnceValues(func() ([]byte, error) {
	return exec.Command(python, "-c", "import matplotlib, numpy").CombinedOutput()
})

// formatted runs script's figures through the e2b/chart formatter: the JSON text it gives
// each figure (nil for none), and what it gives values that are not figures.
func formatted(t *testing.T, script string) (figures, others []*string) {
	t.Helper()
	out, err := havePython()
	require.NoError(t, err, "%s with matplotlib and numpy is needed (apt-get install python3-matplotlib "+
		"python3-numpy; .ci/deps does): %s", python, out)
	dir := t.TempDir()
	src, fig := filepath.Join(dir, "charts.py"), filepath.Join(dir, "figures.py")
	require.NoError(t, os.WriteFile(src, []byte(Source), 0o600))
	require.NoError(t, os.WriteFile(fig, []byte(script), 0o600))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", harness, src, fig)
	cmd.Env = append(os.Environ(), "MPLBACKEND=Agg")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "stderr: %s", stderr.String())
	var got struct{ Charts, Others []*string }
	require.NoError(t, json.Unmarshal(stdout, &got), "%s", stdout)
	return got.Charts, got.Others
}

// chartOf is the chart of script's one figure, decoded.
func chartOf(t *testing.T, script string) map[string]any {
	t.Helper()
	figures, _ := formatted(t, script)
	require.Len(t, figures, 1)
	require.NotNil(t, figures[0], "a figure has a chart")
	var chart map[string]any
	require.NoError(t, json.Unmarshal([]byte(*figures[0]), &chart))
	return chart
}

func elements(t *testing.T, chart map[string]any) []map[string]any {
	t.Helper()
	raw, ok := chart["elements"].([]any)
	require.True(t, ok, "elements is a list: %v", chart["elements"])
	out := make([]map[string]any, len(raw))
	for i, e := range raw {
		out[i], ok = e.(map[string]any)
		require.True(t, ok, "element %d is an object: %v", i, e)
	}
	return out
}

// column is each element's key.
func column(elems []map[string]any, key string) []any {
	out := make([]any, len(elems))
	for i, e := range elems {
		out[i] = e[key]
	}
	return out
}

func allOf[T any](t *testing.T, v any) []T {
	t.Helper()
	raw, ok := v.([]any)
	require.True(t, ok, "a list: %v", v)
	out := make([]T, len(raw))
	for i, x := range raw {
		out[i], ok = x.(T)
		require.True(t, ok, "item %d of %v is a %T", i, v, out[i])
	}
	return out
}

// assertTicks: a point chart's ticks on axis ("x" or "y") are numbers, or times in ISO
// form on a datetime axis, and its tick labels text, as many as the ticks.
func assertTicks(t *testing.T, chart map[string]any, axis string) {
	t.Helper()
	labels := allOf[string](t, chart[axis+"_tick_labels"])
	if chart[axis+"_scale"] == "datetime" {
		ticks := allOf[string](t, chart[axis+"_ticks"])
		require.NotEmpty(t, ticks)
		for _, tick := range ticks {
			_, err := time.Parse(time.RFC3339, tick)
			assert.NoError(t, err)
		}
		assert.Len(t, labels, len(ticks))
		return
	}
	ticks := allOf[float64](t, chart[axis+"_ticks"])
	require.NotEmpty(t, ticks)
	assert.Len(t, labels, len(ticks))
}

// E2B's line test: dates along x, two labelled lines, units in the labels' parentheses.
func TestLine(t *testing.T) {
	t.Parallel()
	chart := chartOf(t, `
import numpy as np
import matplotlib.pyplot as plt
import datetime
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
x = np.linspace(0, 2*np.pi, 100)
plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(x), label='sin(x)')
plt.plot(dates, np.cos(x), label='cos(x)')
plt.xlabel("Time (s)")
plt.ylabel("Amplitude (Hz)")
plt.title('Plot of sin(x) and cos(x)')
`)
	assert.Equal(t, "line", chart["type"])
	assert.Equal(t, "Plot of sin(x) and cos(x)", chart["title"])
	assert.Equal(t, "Time (s)", chart["x_label"])
	assert.Equal(t, "Amplitude (Hz)", chart["y_label"])
	assert.Equal(t, "s", chart["x_unit"])
	assert.Equal(t, "Hz", chart["y_unit"])
	assert.Equal(t, "datetime", chart["x_scale"])
	assert.Equal(t, "linear", chart["y_scale"])
	assertTicks(t, chart, "x")
	assertTicks(t, chart, "y")

	lines := elements(t, chart)
	require.Len(t, lines, 2)
	assert.Equal(t, []any{"sin(x)", "cos(x)"}, column(lines, "label"))
	for _, line := range lines {
		points := allOf[[]any](t, line["points"])
		require.Len(t, points, 100)
		for _, p := range points {
			require.Len(t, p, 2)
			assert.IsType(t, "", p[0])
			assert.IsType(t, 0.0, p[1])
		}
		assert.Equal(t, "2023-09-01", points[0][0])
	}
	assert.Equal(t, 1.0, allOf[[]any](t, lines[1]["points"])[0][1], "cos(0)")
}

// E2B's scales tests: dates make a datetime scale, words a categorical one; and its log
// test: a log scale, its unit "log scale" from "Y-axis (log scale)".
func TestScales(t *testing.T) {
	t.Parallel()
	t.Run("datetime", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import numpy as np, matplotlib.pyplot as plt, datetime
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(np.linspace(0, 2*np.pi, 100)), label='sin(x)')
`)
		assert.Equal(t, "line", chart["type"])
		assert.Equal(t, "datetime", chart["x_scale"])
		assert.Equal(t, "linear", chart["y_scale"])
		assert.Nil(t, chart["title"])
		assert.Nil(t, chart["x_label"])
	})
	t.Run("datetime64", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import numpy as np, matplotlib.pyplot as plt
plt.plot(np.arange('2024-01-01T00', '2024-01-02T00', dtype='datetime64[h]'), np.arange(24.0))
`)
		assert.Equal(t, "datetime", chart["x_scale"])
		points := allOf[[]any](t, elements(t, chart)[0]["points"])
		require.Len(t, points, 24)
		assert.Equal(t, []any{"2024-01-01T05:00:00", 5.0}, points[5])
	})
	t.Run("categorical", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import matplotlib.pyplot as plt
plt.figure(figsize=(10, 6))
plt.plot([1, 2, 3, 4, 5], ['A', 'B', 'C', 'D', 'E'])
`)
		assert.Equal(t, "line", chart["type"])
		assert.Equal(t, "linear", chart["x_scale"])
		assert.Equal(t, "categorical", chart["y_scale"])
		assert.Equal(t, []string{"A", "B", "C", "D", "E"}, allOf[string](t, chart["y_tick_labels"]))
		line := elements(t, chart)[0]
		assert.Equal(t, "Line 0", line["label"], "an unlabelled line's name")
		assert.Equal(t, []any{3.0, "C"}, allOf[[]any](t, line["points"])[2])
	})
	t.Run("log", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import numpy as np, matplotlib.pyplot as plt
x = np.linspace(0, 100, 100)
plt.figure(figsize=(10, 6))
plt.plot(x, np.exp(x), label='y = e^x')
plt.yscale('log')
plt.xlabel('X-axis')
plt.ylabel('Y-axis (log scale)')
plt.title('Chart with Log Scale on Y-axis')
plt.legend()
plt.grid(True)
`)
		assert.Equal(t, "line", chart["type"])
		assert.Equal(t, "Chart with Log Scale on Y-axis", chart["title"])
		assert.Equal(t, "X-axis", chart["x_label"])
		assert.Nil(t, chart["x_unit"])
		assert.Equal(t, "log scale", chart["y_unit"])
		assert.Equal(t, "linear", chart["x_scale"])
		assert.Equal(t, "log", chart["y_scale"])
		assertTicks(t, chart, "x")
		assertTicks(t, chart, "y")
		lines := elements(t, chart)
		require.Len(t, lines, 1, "the grid's lines are not series")
		assert.Equal(t, "y = e^x", lines[0]["label"])
		points := allOf[[]any](t, lines[0]["points"])
		require.Len(t, points, 100)
		for _, p := range points {
			assert.IsType(t, 0.0, p[0])
			assert.IsType(t, 0.0, p[1])
		}
	})
}

// E2B's scatter test: two labelled series of 5 and 10 points, no title.
func TestScatter(t *testing.T) {
	t.Parallel()
	chart := chartOf(t, `
import matplotlib.pyplot as plt
import numpy as np
N = 5
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(N), np.random.rand(N), c='blue', label='Dataset 1')
plt.scatter(np.random.rand(2*N), np.random.rand(2*N), c='red', label='Dataset 2')
plt.axhline(0.5)  # (a rule across the axes is not a series, nor makes it unknown)
`)
	assert.Equal(t, "scatter", chart["type"])
	assert.Nil(t, chart["title"])
	assert.Equal(t, "A", chart["x_label"])
	assert.Equal(t, "B", chart["y_label"])
	assert.Equal(t, "linear", chart["x_scale"])
	assertTicks(t, chart, "x")
	assertTicks(t, chart, "y")
	series := elements(t, chart)
	require.Len(t, series, 2)
	assert.Equal(t, []any{"Dataset 1", "Dataset 2"}, column(series, "label"))
	for i, n := range []int{5, 10} {
		points := allOf[[]any](t, series[i]["points"])
		require.Len(t, points, n)
		for _, p := range points {
			assert.IsType(t, 0.0, p[0])
			assert.IsType(t, 0.0, p[1])
		}
	}
}

func TestBar(t *testing.T) {
	t.Parallel()
	// E2B's bar test.
	t.Run("simple", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import matplotlib.pyplot as plt
plt.figure(figsize=(10, 6))
plt.bar(['Author A', 'Author B', 'Author C', 'Author D'], [100, 200, 300, 400], label='Books Sold', color='blue')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.tight_layout()
`)
		assert.Equal(t, "bar", chart["type"])
		assert.Equal(t, "Book Sales by Authors", chart["title"])
		assert.Equal(t, "Authors", chart["x_label"])
		assert.Equal(t, "Number of Books Sold", chart["y_label"])
		assert.Contains(t, chart, "x_unit")
		assert.Nil(t, chart["x_unit"])
		assert.Nil(t, chart["y_unit"])
		bars := elements(t, chart)
		require.Len(t, bars, 4)
		assert.Equal(t, []any{100.0, 200.0, 300.0, 400.0}, column(bars, "value"))
		assert.Equal(t, []any{"Books Sold", "Books Sold", "Books Sold", "Books Sold"}, column(bars, "group"))
		assert.Equal(t, []any{"Author A", "Author B", "Author C", "Author D"}, column(bars, "label"))
	})
	// Grouped bars beside each other, the ticks under the middle group's.
	t.Run("grouped", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import numpy as np, matplotlib.pyplot as plt
species = ("Adelie", "Chinstrap", "Gentoo")
means = {'Depth': (18.35, 18.43, 14.98), 'Length': (38.79, 48.83, 47.50), 'Flipper': (189.95, 195.82, 217.19)}
x = np.arange(len(species))
fig, ax = plt.subplots()
for i, (name, v) in enumerate(means.items()):
    ax.bar(x + 0.25 * i, v, 0.25, label=name)
ax.set_xticks(x + 0.25, species)
ax.set_ylabel('Length (mm)')
`)
		assert.Equal(t, "bar", chart["type"])
		assert.Equal(t, "mm", chart["y_unit"])
		bars := elements(t, chart)
		require.Len(t, bars, 9)
		assert.Equal(t, []any{"Adelie", "Chinstrap", "Gentoo", "Adelie", "Chinstrap", "Gentoo", "Adelie", "Chinstrap", "Gentoo"},
			column(bars, "label"))
		assert.Equal(t, []any{"Depth", "Depth", "Depth", "Length", "Length", "Length", "Flipper", "Flipper", "Flipper"},
			column(bars, "group"))
		assert.Equal(t, []any{18.35, 18.43, 14.98, 38.79, 48.83, 47.5, 189.95, 195.82, 217.19}, column(bars, "value"))
	})
	// Stacked bars: each its own part, unlabelled groups numbered.
	t.Run("stacked", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import matplotlib.pyplot as plt
plt.bar(['a', 'b'], [1, 2])
plt.bar(['a', 'b'], [4, 5], bottom=[1, 2])
`)
		bars := elements(t, chart)
		require.Len(t, bars, 4)
		assert.Equal(t, []any{"a", "b", "a", "b"}, column(bars, "label"))
		assert.Equal(t, []any{1.0, 2.0, 4.0, 5.0}, column(bars, "value"))
		assert.Equal(t, []any{"Group 0", "Group 0", "Group 1", "Group 1"}, column(bars, "group"))
	})
	// Bars on a number axis with automatic ticks are called by their places (all the same
	// height: still upright), a histogram's by its bins' middles.
	t.Run("numbers", func(t *testing.T) {
		t.Parallel()
		figures, _ := formatted(t, `
import matplotlib.pyplot as plt
plt.figure(); plt.bar([1, 2, 3], [5, 5, 5])
plt.figure(); plt.hist([1, 2, 2, 3, 3, 3, 4, 4, 5], bins=4)
`)
		require.Len(t, figures, 2)
		for i, want := range []struct{ labels, values []any }{
			{[]any{"1", "2", "3"}, []any{5.0, 5.0, 5.0}},
			{[]any{"1.5", "2.5", "3.5", "4.5"}, []any{1.0, 2.0, 3.0, 3.0}},
		} {
			var chart map[string]any
			require.NoError(t, json.Unmarshal([]byte(*figures[i]), &chart))
			assert.Equal(t, "bar", chart["type"])
			bars := elements(t, chart)
			assert.Equal(t, want.labels, column(bars, "label"))
			assert.Equal(t, want.values, column(bars, "value"))
		}
	})
	// Lying bars: x_label is the categories' axis's, as for upright ones.
	t.Run("horizontal", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import matplotlib.pyplot as plt
plt.barh(['p', 'q', 'r'], [3, 3, 7])
plt.xlabel('Count [n]')
plt.ylabel('Thing')
`)
		assert.Equal(t, "Thing", chart["x_label"])
		assert.Equal(t, "Count [n]", chart["y_label"])
		assert.Equal(t, "n", chart["y_unit"])
		bars := elements(t, chart)
		assert.Equal(t, []any{"p", "q", "r"}, column(bars, "label"))
		assert.Equal(t, []any{3.0, 3.0, 7.0}, column(bars, "value"))
	})
}

// E2B's pie test: two wedges, their angles in degrees (324 and 36, not float32's
// 323.9999914), radius 1; a pie has no axis labels.
func TestPie(t *testing.T) {
	t.Parallel()
	chart := chartOf(t, `
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 8))
plt.xlabel("x")
plt.ylabel("y")
ax.pie([90, 10], labels=["No", "No, in blue"], autopct='%1.1f%%', startangle=90, colors=plt.cm.Pastel1.colors[:2])
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
`)
	assert.Equal(t, "pie", chart["type"])
	assert.Equal(t, "Will I wake up early tomorrow?", chart["title"])
	assert.NotContains(t, chart, "x_label")
	wedges := elements(t, chart)
	require.Len(t, wedges, 2)
	assert.Equal(t, []any{"No", "No, in blue"}, column(wedges, "label"))
	assert.Equal(t, []any{324.0, 36.0}, column(wedges, "angle"))
	assert.Equal(t, []any{1.0, 1.0}, column(wedges, "radius"))
}

func TestBoxAndWhisker(t *testing.T) {
	t.Parallel()
	// E2B's box-and-whisker test.
	t.Run("patches", func(t *testing.T) {
		t.Parallel()
		chart := chartOf(t, `
import matplotlib.pyplot as plt
data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}
fig, ax = plt.subplots(figsize=(10, 6))
ax.set_title('Exam Scores Distribution')
ax.set_xlabel('Class')
ax.set_ylabel('Score')
ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)
plt.tight_layout()
`)
		assert.Equal(t, "box_and_whisker", chart["type"])
		assert.Equal(t, "Exam Scores Distribution", chart["title"])
		assert.Equal(t, "Class", chart["x_label"])
		assert.Equal(t, "Score", chart["y_label"])
		assert.Nil(t, chart["x_unit"])
		assert.Nil(t, chart["y_unit"])
		boxes := elements(t, chart)
		require.Len(t, boxes, 3)
		assert.Equal(t, []any{"Class A", "Class B", "Class C"}, column(boxes, "label"))
		assert.Equal(t, []any{[]any{}, []any{76.0}, []any{}}, column(boxes, "outliers"))
		assert.Equal(t, []any{78.0, 84.0, 75.0}, column(boxes, "min"))
		assert.Equal(t, []any{85.0, 84.75, 79.0}, column(boxes, "first_quartile"))
		assert.Equal(t, []any{88.0, 88.0, 82.0}, column(boxes, "median"))
		assert.Equal(t, []any{90.0, 90.5, 86.0}, column(boxes, "third_quartile"))
		assert.Equal(t, []any{92.0, 95.0, 88.0}, column(boxes, "max"))
	})
	// boxplot's default draws boxes as lines; lying boxes swap the labels as bars do; a
	// mean's mark is not an outlier.
	t.Run("lines, lying, mean", func(t *testing.T) {
		t.Parallel()
		figures, _ := formatted(t, `
import matplotlib.pyplot as plt
data = [[1, 2, 3, 4, 5, 20], [2, 3, 4, 5, 6]]
plt.figure(); plt.boxplot(data)
plt.figure(); plt.boxplot(data, vert=False, labels=['u', 'v'], showmeans=True, patch_artist=True)
plt.xlabel('Size (cm)'); plt.ylabel('Kind')
`)
		require.Len(t, figures, 2)
		for i, f := range figures {
			var chart map[string]any
			require.NoError(t, json.Unmarshal([]byte(*f), &chart))
			assert.Equal(t, "box_and_whisker", chart["type"])
			boxes := elements(t, chart)
			require.Len(t, boxes, 2)
			assert.Equal(t, []any{1.0, 2.0}, column(boxes, "min"))
			assert.Equal(t, []any{2.25, 3.0}, column(boxes, "first_quartile"))
			assert.Equal(t, []any{3.5, 4.0}, column(boxes, "median"))
			assert.Equal(t, []any{4.75, 5.0}, column(boxes, "third_quartile"))
			assert.Equal(t, []any{5.0, 6.0}, column(boxes, "max"))
			assert.Equal(t, []any{[]any{20.0}, []any{}}, column(boxes, "outliers"))
			if i == 0 {
				assert.Equal(t, []any{"1", "2"}, column(boxes, "label"))
			} else {
				assert.Equal(t, []any{"u", "v"}, column(boxes, "label"))
				assert.Equal(t, "Kind", chart["x_label"])
				assert.Equal(t, "cm", chart["y_unit"])
			}
		}
	})
}

// E2B's superchart test: a figure of two axes is a superchart of their charts, titled
// by the figure's suptitle.
func TestSuperchart(t *testing.T) {
	t.Parallel()
	chart := chartOf(t, `
import matplotlib.pyplot as plt
import numpy as np
x1 = np.linspace(0, 10, 100)
fig, axs = plt.subplots(1, 2, figsize=(10, 8))
fig.suptitle('Multiple Charts Example', fontsize=16)
axs[0].plot(x1, np.sin(x1), 'r')
axs[0].set_title('Sine Wave')
axs[0].grid(True)
axs[1].scatter(np.random.rand(5), np.random.rand(5), c='blue', label='Dataset 1')
axs[1].set_xlabel('X')
axs[1].set_ylabel('Y')
axs[1].set_title('Scatter Plot')
axs[1].grid(True)
`)
	assert.Equal(t, "superchart", chart["type"])
	assert.Equal(t, "Multiple Charts Example", chart["title"])
	charts := elements(t, chart)
	require.Len(t, charts, 2)

	assert.Equal(t, "line", charts[0]["type"])
	assert.Equal(t, "Sine Wave", charts[0]["title"])
	assert.Contains(t, charts[0], "x_label")
	assert.Nil(t, charts[0]["x_label"])
	assert.Nil(t, charts[0]["y_label"])
	lines := elements(t, charts[0])
	require.Len(t, lines, 1)
	assert.Len(t, lines[0]["points"], 100)

	assert.Equal(t, "scatter", charts[1]["type"])
	assert.Equal(t, "Scatter Plot", charts[1]["title"])
	assert.Equal(t, "X", charts[1]["x_label"])
	assert.Equal(t, "Y", charts[1]["y_label"])
	series := elements(t, charts[1])
	require.Len(t, series, 1)
	assert.Len(t, series[0]["points"], 5)
}

// E2B's unknown test (circles), an image and a 3D surface: unknown charts, their title
// kept, no elements; an image's colorbar is not a chart of its own.
func TestUnknown(t *testing.T) {
	t.Parallel()
	figures, _ := formatted(t, `
import matplotlib.pyplot as plt
import numpy as np
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, color='blue', fill=False, linewidth=2))
ax.add_artist(plt.Circle((0, 0), 2, color='red', fill=False, linewidth=2))
ax.grid(True)
plt.title('Two Concentric Circles')
fig, ax = plt.subplots()
fig.colorbar(ax.imshow(np.eye(4)))
ax.set_title('Image')
fig = plt.figure()
ax = fig.add_subplot(projection='3d')
X, Y = np.meshgrid(np.arange(4), np.arange(4))
ax.plot_surface(X, Y, X * Y)
`)
	require.Len(t, figures, 3)
	for i, title := range []any{"Two Concentric Circles", "Image", nil} {
		require.NotNil(t, figures[i])
		var chart map[string]any
		require.NoError(t, json.Unmarshal([]byte(*figures[i]), &chart))
		assert.Equal(t, map[string]any{"type": "unknown", "title": title, "elements": []any{}}, chart)
	}
}

// A figure without data, and one that cannot be read (its get_axes raises), have the
// chart {} as E2B's formatter gives them; values that are not figures have none.
func TestNoChart(t *testing.T) {
	t.Parallel()
	figures, others := formatted(t, `
import matplotlib.pyplot as plt
plt.subplots()
fig, ax = plt.subplots()
ax.plot([1, 2])
def broken():
    raise RuntimeError("no axes today")
fig.get_axes = broken
`)
	require.Len(t, figures, 2)
	for _, f := range figures {
		require.NotNil(t, f)
		assert.JSONEq(t, `{}`, *f)
	}
	require.Len(t, others, 5)
	for _, o := range others {
		assert.Nil(t, o)
	}
}

// A series keeps at most 10,000 points, evenly spread and its ends kept, and a figure's
// series share 50,000; values JSON has not (NaN, inf) are null.
func TestCaps(t *testing.T) {
	t.Parallel()
	figures, _ := formatted(t, `
import numpy as np, matplotlib.pyplot as plt
n = 3_000_000
plt.figure()
plt.plot(np.arange(n), np.arange(n) * 2.0, label='big')
plt.plot([0, 1, 2], [1, np.nan, np.inf], label='gaps')
plt.figure()
for i in range(100):
    plt.scatter(np.arange(10_000), np.arange(10_000))
`)
	require.Len(t, figures, 2)
	var chart map[string]any
	require.NoError(t, json.Unmarshal([]byte(*figures[0]), &chart))
	lines := elements(t, chart)
	require.Len(t, lines, 2)
	points := allOf[[]any](t, lines[0]["points"])
	require.Len(t, points, 10_000)
	assert.Equal(t, []any{0.0, 0.0}, points[0])
	assert.Equal(t, []any{2_999_999.0, 5_999_998.0}, points[len(points)-1])
	for _, p := range points {
		assert.Equal(t, p[0].(float64)*2, p[1])
	}
	assert.Equal(t, []any{[]any{0.0, 1.0}, []any{1.0, nil}, []any{2.0, nil}}, lines[1]["points"])

	require.NoError(t, json.Unmarshal([]byte(*figures[1]), &chart))
	series := elements(t, chart)
	require.Len(t, series, 100)
	total := 0
	for _, s := range series {
		total += len(allOf[[]any](t, s["points"]))
	}
	assert.Equal(t, 50_000, total)
	assert.Equal(t, "Scatter 0", series[0]["label"])
}
