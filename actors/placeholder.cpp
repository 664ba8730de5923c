// Replaced by the message definitions (messages/*.cpp) of the actor runtime.
