// Must NOT compile against the chat layer's include root: chat templates build on core and io (a GGUF file's
// tokenizer.chat_template), never on the model.
#include "mambacpp/model.h"
