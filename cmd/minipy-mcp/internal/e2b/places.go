package e2b

// A sandbox's places under the server's caps (Config.Admit, Config.HoldPaused), taken and
// given back here and in newContext/codeContext.close only: each running code context
// holds a place (taken as it is made, given back as it closes), and a paused sandbox holds
// one of its user's (taken as its pause ends, before its contexts close; given back as its
// resume starts, before its contexts are made again, or as it is killed or forgotten). A
// context is one of its sandbox's only while the sandbox runs: one made while it pauses,
// resumes or dies is closed at once (createContext, restartContext), so that no place
// outlives what holds it, whatever the order of create, pause, resume and kill.

// holdPausedPlace gives sb, paused, its place under its user's cap, if it has none (sb.mu
// held, or sb not yet shared).
func (s *Server) holdPausedPlace(sb *sandbox) {
	if s.cfg.HoldPaused != nil && sb.pausedPlace == nil {
		sb.pausedPlace = s.cfg.HoldPaused(sb.user)
	}
}

// dropPausedPlace gives back sb's place as a paused sandbox, if it holds one (sb.mu held).
func (sb *sandbox) dropPausedPlace() {
	if sb.pausedPlace != nil {
		sb.pausedPlace()
		sb.pausedPlace = nil
	}
}

// holds reports whether cc is one of sb's contexts now (sb.mu held): sb is not dead and
// has it (a pause in progress closes it when it ends, or leaves it be).
func (sb *sandbox) holds(cc *codeContext) bool {
	if sb.dead {
		return false
	}
	for _, c := range sb.contexts {
		if c == cc {
			return true
		}
	}
	return false
}
