//go:build !race

package minipy_test

const raceEnabled = false
