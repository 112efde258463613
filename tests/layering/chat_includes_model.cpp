// Must NOT compile against the chat layer's include root: chat templates build on core only, never on the model.
#include "mambacpp/model.h"
