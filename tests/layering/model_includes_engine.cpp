// Must NOT compile against the model layer's include root: the engine is above the model.
#include "mambacpp/engine.h"
