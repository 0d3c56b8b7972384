package minipy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Auto picks the engine for a project directory, as gptme's "auto" backend does: when the
// project has a virtualenv, the isolated engine on that virtualenv's python, so that the
// code imports the project's packages and the packages it installs (pip, %pip) go to that
// environment; otherwise the in-process engine. See FindVirtualenv for how the virtualenv
// is found.
//
// The isolated engine Auto starts is NewIsolated's sandbox with three openings that a
// project needs: the virtualenv is mounted writable, the project directory is mounted
// read-only at its own path (editable installs point into it), and the network is on
// (pip). For other choices, build an IsolatedConfig from FindVirtualenv yourself.
func Auto(dir string) (Engine, error) {
	return NewBackend(BackendAuto, dir, IsolatedConfig{})
}

// withVirtualenv is cfg running on virtualenv venv of project: its python (unless cfg names
// one), the network on, the project read-only and the venv writable (after cfg's mounts)
// and VIRTUAL_ENV set.
func withVirtualenv(cfg IsolatedConfig, venv, project string) IsolatedConfig {
	if cfg.Python == "" {
		cfg.Python = filepath.Join(venv, "bin", "python")
	}
	cfg.Network = true
	cfg.Mounts = append([]Mount(nil), cfg.Mounts...)
	if project != "" && !within(project, venv) {
		// The project first: a venv inside it (.venv) is then mounted over its read-only copy.
		cfg.Mounts = append(cfg.Mounts, Mount{Source: project, Target: project})
	}
	cfg.Mounts = append(cfg.Mounts, Mount{Source: venv, Target: venv, Writable: true})
	cfg.Env = append(append([]string(nil), cfg.Env...), "VIRTUAL_ENV="+venv)
	return cfg
}

// Backends, as the commands' --backend flag names them (see NewBackend).
const (
	BackendAuto      = "auto"
	BackendInProcess = "inprocess"
	BackendIsolated  = "isolated"
)

// ErrBackend is matched by NewBackend's error for a name it does not know.
var ErrBackend = errors.New("minipy: the backend must be auto, inprocess or isolated")

// NewBackend starts the engine that a backend name asks for, as gptme's backends do:
// BackendInProcess is InProcess; BackendIsolated is NewIsolated(cfg); BackendAuto is Auto's
// choice for dir, with cfg's settings (workers, limits, mounts) kept when it picks the
// isolated engine.
func NewBackend(name, dir string, cfg IsolatedConfig) (Engine, error) {
	switch name {
	case BackendInProcess:
		return InProcess(), nil
	case BackendIsolated:
		return NewIsolated(cfg)
	case BackendAuto:
		venv, project, err := FindVirtualenv(dir)
		if err != nil {
			return nil, err
		}
		if venv == "" {
			return InProcess(), nil
		}
		return NewIsolated(withVirtualenv(cfg, venv, project))
	}
	return nil, fmt.Errorf("%w, not %q", ErrBackend, name)
}

// ErrNoVirtualenv is matched by the error of FindVirtualenv (and Auto) for a project that
// declares a uv environment (uv.lock, [tool.uv]) that has not been made yet.
var ErrNoVirtualenv = errors.New("minipy: the project's virtualenv does not exist yet (run `uv sync`)")

// FindVirtualenv finds the virtualenv that code run for the project in dir should use, and
// the project's directory: the active one ($VIRTUAL_ENV) first; else, from dir up to the
// first directory that holds a .git or one of these markers, a `.venv` directory, or the
// environment of a uv project (`uv.lock`, or `[tool.uv]` in pyproject.toml:
// $UV_PROJECT_ENVIRONMENT, or .venv). It returns "" when there is none (a uv project whose
// environment is missing is an error matching ErrNoVirtualenv). A virtualenv is a directory
// with pyvenv.cfg and bin/python.
func FindVirtualenv(dir string) (venv, project string, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	if active := os.Getenv("VIRTUAL_ENV"); active != "" {
		if !isVirtualenv(active) {
			return "", "", fmt.Errorf("minipy: $VIRTUAL_ENV=%s is not a virtualenv (no pyvenv.cfg and bin/python)", active)
		}
		return filepath.Clean(active), projectOf(dir), nil
	}
	for d := dir; ; d = filepath.Dir(d) {
		if v := filepath.Join(d, ".venv"); isVirtualenv(v) {
			return v, d, nil
		}
		if isUVProject(d) {
			v := os.Getenv("UV_PROJECT_ENVIRONMENT")
			switch {
			case v == "":
				v = filepath.Join(d, ".venv")
			case !filepath.IsAbs(v):
				v = filepath.Join(d, v)
			}
			if !isVirtualenv(v) {
				return "", d, fmt.Errorf("%w: %s is a uv project, but %s is not a virtualenv", ErrNoVirtualenv, d, v)
			}
			return v, d, nil
		}
		if exists(filepath.Join(d, ".git")) || filepath.Dir(d) == d {
			return "", "", nil
		}
	}
}

// projectOf is the project directory of dir: the nearest one up that holds a .git or a
// pyproject.toml, else dir itself.
func projectOf(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if exists(filepath.Join(d, ".git")) || exists(filepath.Join(d, "pyproject.toml")) {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

func isVirtualenv(dir string) bool {
	return exists(filepath.Join(dir, "pyvenv.cfg")) && exists(filepath.Join(dir, "bin", "python"))
}

func isUVProject(dir string) bool {
	if exists(filepath.Join(dir, "uv.lock")) {
		return true
	}
	toml, err := os.ReadFile(filepath.Join(dir, "pyproject.toml"))
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(toml, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if bytes.Equal(line, []byte("[tool.uv]")) || bytes.HasPrefix(line, []byte("[tool.uv.")) {
			return true
		}
	}
	return false
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// within reports whether path is dir or lies under it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
