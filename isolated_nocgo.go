//go:build !cgo

package minipy

// linkedPythonVersion is unknown without cgo (no libpython is linked).
func linkedPythonVersion() string { return "" }
