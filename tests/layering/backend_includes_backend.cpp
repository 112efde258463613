// Compiles against the backend layer's include root: its own headers are there (the control for the next file).
#include "backend/backend.h"
