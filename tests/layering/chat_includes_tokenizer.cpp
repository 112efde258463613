// Must NOT compile against the chat layer's include root: rendering is text to text; tokenizing is the caller's.
#include "mambacpp/tokenizer.h"
