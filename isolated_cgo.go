//go:build cgo

package minipy

/*
#cgo pkg-config: python3-embed
#include <patchlevel.h>
*/
import "C"

import "fmt"

// linkedPythonVersion is the "major.minor" of the libpython this binary is built against.
func linkedPythonVersion() string {
	return fmt.Sprintf("%d.%d", C.PY_MAJOR_VERSION, C.PY_MINOR_VERSION)
}
