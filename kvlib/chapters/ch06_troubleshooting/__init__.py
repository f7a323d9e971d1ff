"""The troubleshooting page: the article's four symptoms, each reproduced small and fixed."""
