"""Maximum inner product search over document embeddings."""
