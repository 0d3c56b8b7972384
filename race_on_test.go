//go:build race

package minipy_test

// raceEnabled: the race detector's shadow memory grows RSS on its own, so the soak test
// checks RSS only without it (and Python's and Go's own counters always).
const raceEnabled = true
