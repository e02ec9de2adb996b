public enum EncoreEventsPlaceholder {}
