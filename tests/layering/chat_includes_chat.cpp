// Compiles against the chat layer's include root: its own headers and core's are there (the control for the next).
#include "chat/value.h"
#include "mambacpp/chat.h"
#include "mambacpp/error.h"
