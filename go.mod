module github.com/minipy-go/minipy

go 1.24

require (
	github.com/chzyer/readline v1.5.1
	github.com/creack/pty v1.1.24
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/google/jsonschema-go v0.4.3
	github.com/moby/profiles/seccomp v0.3.0
	github.com/opencontainers/runtime-spec v1.2.1
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.41.0
	golang.org/x/sys v0.33.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
