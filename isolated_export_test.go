package minipy

// NewIsolatedActingUnsandboxed is NewIsolated on a kernel that (it pretends) refuses
// namespaces, for the tests of AllowUnsandboxed.
func NewIsolatedActingUnsandboxed(cfg IsolatedConfig) (*Isolated, error) {
	return newIsolated(cfg, false)
}
