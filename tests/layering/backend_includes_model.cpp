// Must NOT compile against the backend layer's include root: a backend including a model header is a back-edge.
#include "model/weights.h"
