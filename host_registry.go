package minipy

// The engine's registry of host functions: which namespaces hold which Function, by id.

import (
	"sort"
	"sync"
)

// hostRegistry is an engine's registered functions, by id and by namespace.
type hostRegistry struct {
	mu   sync.Mutex
	next uint64
	byID map[uint64]*hostFunc
	byNS map[uint32]map[string]*hostFunc
}

// add registers fns in namespace ns, replacing functions of the same names, and gives each
// its id.
func (r *hostRegistry) add(ns uint32, fns []*hostFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[uint64]*hostFunc{}
		r.byNS = map[uint32]map[string]*hostFunc{}
	}
	names := r.byNS[ns]
	if names == nil {
		names = map[string]*hostFunc{}
		r.byNS[ns] = names
	}
	for _, hf := range fns {
		r.next++
		hf.id, hf.refs = r.next, 1
		hf.spec[1] = int64(hf.id)
		if old := names[hf.fn.Name]; old != nil {
			r.unref(old)
		}
		names[hf.fn.Name] = hf
		r.byID[hf.id] = hf
	}
}

func (r *hostRegistry) unref(hf *hostFunc) {
	if hf.refs--; hf.refs == 0 {
		delete(r.byID, hf.id)
	}
}

// forget drops namespace ns's functions (it was freed).
func (r *hostRegistry) forget(ns uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, hf := range r.byNS[ns] {
		r.unref(hf)
	}
	delete(r.byNS, ns)
}

// fork gives namespace to the functions of namespace from (a Fork's copy): the same
// functions, with the same ids, which the copy's Python functions call.
func (r *hostRegistry) fork(from, to uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.byNS[from]) == 0 {
		return
	}
	names := make(map[string]*hostFunc, len(r.byNS[from]))
	for name, hf := range r.byNS[from] {
		hf.refs++
		names[name] = hf
	}
	r.byNS[to] = names
}

// holds reports whether hf is one of namespace ns's functions.
func (r *hostRegistry) holds(ns uint32, hf *hostFunc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ns != 0 && r.byNS[ns][hf.fn.Name] == hf
}

// has reports whether any of the namespaces has functions.
func (r *hostRegistry) has(ids ...uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if len(r.byNS[id]) > 0 {
			return true
		}
	}
	return false
}

// functions returns namespace ns's functions, sorted by name.
func (r *hostRegistry) functions(ns uint32) []*hostFunc {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*hostFunc, 0, len(r.byNS[ns]))
	for _, hf := range r.byNS[ns] {
		out = append(out, hf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].fn.Name < out[j].fn.Name })
	return out
}

// specs returns the registration requests that recreate namespace ns's functions in a new
// worker, or nil.
func (r *hostRegistry) specs(ns uint32) []any {
	fns := r.functions(ns)
	if len(fns) == 0 {
		return nil
	}
	specs := make([]any, len(fns))
	for i, hf := range fns {
		specs[i] = hf.spec
	}
	return specs
}

func (r *hostRegistry) lookup(id uint64) *hostFunc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}
